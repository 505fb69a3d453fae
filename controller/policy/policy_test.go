package policy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/policy"
)

func TestParseErrorsNameTheLine(t *testing.T) {
	t.Parallel()
	c := catalog.Default()
	for name, tc := range map[string]struct{ doc, want string }{
		"unknown key":       {"reasons:\n  GPUHang:\n    tolerance: 5m\n", "line 3"},
		"unknown reason":    {"reasons:\n  GPUHang: {toleration: 5m}\n  NoSuchReason: {disabled: true}\n", "line 3: reasons.NoSuchReason: unknown reason code"},
		"bad duration":      {"nodePools:\n  big:\n    toleration: soon\n", "line 3"},
		"bad action":        {"reasons:\n  GPUHang: {action: explode}\n", "unknown action"},
		"event with action": {"reasons:\n  XidApplicationError: {action: replace}\n", "condition-severity reasons only"},
		"pool unknown code": {"nodePools:\n  big:\n    reasons:\n      Nope: {disabled: true}\n", "line 4: nodePools.big.reasons.Nope"},
		"not yaml":          {"reasons: [1, 2", "decode"},
		"wrong type":        {"reasons: 3\n", "line 1"},
		"negative duration": {"reasons:\n  GPULost: {toleration: -1m}\n", "line 2"},
	} {
		_, err := policy.Parse([]byte(tc.doc), c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", name, err, tc.want)
		}
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte("reasons:\n  Nope: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := policy.Load(p, catalog.Default())
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("err = %v, want the file and line named", err)
	}
	if _, err := policy.Load(filepath.Join(t.TempDir(), "missing.yaml"), catalog.Default()); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestResolvePrecedence(t *testing.T) {
	t.Parallel()
	c := catalog.Default()
	p, err := policy.Parse([]byte(`
reasons:
  GPUHang: {toleration: 5m, action: replace}
  PCIeFatalError: {disabled: true}
nodePools:
  small:
    toleration: 2m
    reasons:
      GPUHang: {toleration: 1m}
`), c)
	if err != nil {
		t.Fatal(err)
	}
	hang, lost := c.MustLookup(catalog.ReasonGPUHang), c.MustLookup(catalog.ReasonGPULost)
	for name, tc := range map[string]struct {
		got  policy.Effective
		want policy.Effective
	}{
		"catalog default":        {p.Resolve(lost, "big", catalog.ActionReplace), policy.Effective{Toleration: 10 * time.Minute, Action: catalog.ActionReplace}},
		"reason override":        {p.Resolve(hang, "big", catalog.ActionResetGPU), policy.Effective{Toleration: 5 * time.Minute, Action: catalog.ActionReplace}},
		"pool toleration":        {p.Resolve(lost, "small", catalog.ActionReplace), policy.Effective{Toleration: 2 * time.Minute, Action: catalog.ActionReplace}},
		"pool reason wins":       {p.Resolve(hang, "small", catalog.ActionResetGPU), policy.Effective{Toleration: time.Minute, Action: catalog.ActionReplace}},
		"disabled":               {p.Resolve(c.MustLookup(catalog.ReasonPCIeFatalError), "big", catalog.ActionReboot), policy.Effective{Toleration: 10 * time.Minute, Action: catalog.ActionReboot, Disabled: true}},
		"nil policy is defaults": {(*policy.Policy)(nil).Resolve(hang, "small", catalog.ActionResetGPU), policy.Effective{Toleration: 10 * time.Minute, Action: catalog.ActionResetGPU}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, tc.got, tc.want)
		}
	}
	if e, err := policy.Parse(nil, c); err != nil || e == nil {
		t.Errorf("empty policy: %v, %v", e, err)
	}
}
