package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/controller/simulate"
)

const smallPool = "../../controller/simulate/testdata/small-pool-lone-failure.yaml"

func TestSimulateCommand(t *testing.T) {
	t.Parallel()
	failing := filepath.Join(t.TempDir(), "failing.yaml")
	if err := os.WriteFile(failing, []byte(`scenario: failing
fleet: {nodepools: [{name: p, zones: {zone-a: 2}}]}
timeline: [{at: 1m, kind: checkpoint, expect: {deletions: 5, weather: sunny}}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, out string)
	}{
		{
			name: "json for one scenario", args: []string{"simulate", "--json", smallPool},
			check: func(t *testing.T, out string) {
				var r simulate.Result
				if err := json.Unmarshal([]byte(out), &r); err != nil {
					t.Fatalf("decode: %v\n%s", err, out)
				}
				if !r.Pass || len(r.Policies) != 3 || r.Policy(simulate.PolicyFleetRepair).Summary.BrokenUnrepaired != 0 {
					t.Errorf("result: %+v", r)
				}
			},
		},
		{
			name: "text summary", args: []string{"simulate", smallPool},
			check: func(t *testing.T, out string) {
				for _, want := range []string{"synthetic-small-pool-lone-failure: PASS", "fleetrepair", "karpenter", "nvsentinel", "BROKEN UNREPAIRED"} {
					if !strings.Contains(out, want) {
						t.Errorf("output lacks %q:\n%s", want, out)
					}
				}
			},
		},
		{
			name: "table over the case corpus", args: []string{"simulate", "--cases", "../../test/fixtures/cases", "--table", "--policy", "fleetrepair,karpenter"},
			check: func(t *testing.T, out string) {
				if !strings.HasPrefix(out, "| scenario |") || !strings.Contains(out, "| c22-small-pool-repair-blocked | 3 | karpenter |") ||
					strings.Contains(out, "nvsentinel") {
					t.Errorf("table:\n%s", out)
				}
			},
		},
		{name: "strict fails on a failing checkpoint", args: []string{"simulate", "--strict", "--table", failing}, wantErr: "1 of 1 scenarios failed"},
		{name: "without strict a failing checkpoint is reported", args: []string{"simulate", failing},
			check: func(t *testing.T, out string) {
				if !strings.Contains(out, "FAIL 1m deletions: want 5, got 0") || !strings.Contains(out, "UNEVALUATED 1m weather") {
					t.Errorf("output:\n%s", out)
				}
			}},
		{name: "no scenario", args: []string{"simulate"}, wantErr: "at least one scenario"},
		{name: "missing file", args: []string{"simulate", "nope.yaml"}, wantErr: "load nope.yaml"},
		{name: "unknown policy", args: []string{"simulate", "--policy", "yolo", smallPool}, wantErr: "yolo"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, strings.NewReader(""), &out, &errOut)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, out.String())
		})
	}
}
