package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDiagnoseInstanceType: --instance-type gates NVLink findings and
// decides GPU counts offline as the controller does live; --policy extends
// the table; an unknown type is an error, not a silent "unknown".
func TestDiagnoseInstanceType(t *testing.T) {
	t.Parallel()
	links := `{"detector":"nvlink-inactive","gpuPCI":"0000:10:1c.0","count":12,"attrs":{"links":"0,1,2,3,4,5,6,7,8,9,10,11","scope":"all-links"}}` + "\n"
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("instanceTypes:\n  onprem-pcie: {gpus: 2, nvlinks: 0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args       []string
		wantReason string
		wantErr    string
	}{
		{args: []string{"diagnose", "--node", "n1", "-"}, wantReason: "NVLinkError"},
		{args: []string{"diagnose", "--node", "n1", "--instance-type", "p4d.24xlarge", "-"}, wantReason: "NVLinkError"},
		{args: []string{"diagnose", "--node", "n1", "--instance-type", "g5.xlarge", "-"}, wantReason: "NVLinkNotApplicable"},
		{args: []string{"diagnose", "--node", "n1", "--policy", pol, "--instance-type", "onprem-pcie", "-"}, wantReason: "NVLinkNotApplicable"},
		{args: []string{"diagnose", "--node", "n1", "--instance-type", "onprem-pcie", "-"}, wantErr: `unknown instance type "onprem-pcie"`},
	} {
		t.Run(strings.Join(tt.args[1:], " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, strings.NewReader(links), &out, &errOut)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut.String())
			}
			var d struct{ Reason string }
			if err := json.Unmarshal([]byte(strings.SplitN(out.String(), "\n", 2)[0]), &d); err != nil {
				t.Fatalf("decode %q: %v", out.String(), err)
			}
			if d.Reason != tt.wantReason {
				t.Errorf("reason %s, want %s", d.Reason, tt.wantReason)
			}
		})
	}
}

// TestDiagnoseNow: a saved node snapshot's condition is judged as of --now
// (the snapshot's time): fresh then, stale by the wall clock of a later
// reading; a --now that is not a time is an error.
func TestDiagnoseNow(t *testing.T) {
	t.Parallel()
	in := `{"detector":"node-condition","node":"n1","time":"2026-01-01T12:00:00Z","attrs":{"type":"KernelDeadlock","status":"True","reason":"DockerHung","last_heartbeat":"2026-01-01T12:58:00Z"}}` + "\n"
	reason := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), append([]string{"diagnose"}, args...), strings.NewReader(in), &out, &errOut); err != nil {
			return "", err
		}
		var d struct{ Reason string }
		err := json.Unmarshal([]byte(strings.SplitN(out.String(), "\n", 2)[0]), &d)
		return d.Reason, err
	}
	if r, err := reason("--now", "2026-01-01T13:00:00Z", "-"); err != nil || r == "NodeConditionStale" || r == "" {
		t.Errorf("as of the snapshot: %q, %v; want the condition's own reason", r, err)
	}
	if r, err := reason("-"); err != nil || r != "NodeConditionStale" {
		t.Errorf("by the wall clock, months later: %q, %v; want NodeConditionStale", r, err)
	}
	if _, err := reason("--now", "yesterday", "-"); err == nil || !strings.Contains(err.Error(), "RFC 3339") {
		t.Errorf("--now yesterday: %v, want an RFC 3339 error", err)
	}
}
