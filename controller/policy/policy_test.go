package policy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
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
		"sku without gpus":  {"instanceTypes:\n  p5.48xlarge: {nvlinks: 18}\n", "line 2: instanceTypes.p5.48xlarge: gpus must be > 0"},
		"sku unknown key":   {"instanceTypes:\n  p5.48xlarge: {gpus: 8, links: 18}\n", "line 2"},
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

// TestInstanceTypesOverride: the policy file's instanceTypes reach the
// diagnosis: an on-premises type it adds makes "3 of 4 GPUs" a lost GPU,
// and an override that removes NVLink from a type makes its links-down
// finding a false positive.
func TestInstanceTypesOverride(t *testing.T) {
	t.Parallel()
	p, err := policy.Parse([]byte("instanceTypes:\n  onprem-a100x4: {gpus: 4, model: A100, nvlinks: 12}\n  p4d.24xlarge: {gpus: 8, nvlinks: 0}\n"), catalog.Default())
	if err != nil {
		t.Fatal(err)
	}
	eng, err := diagnose.New(diagnose.Options{InstanceTypes: p.InstanceTypeOverrides()})
	if err != nil {
		t.Fatal(err)
	}
	count := finding.Finding{ID: "c", Detector: finding.DetectorGPUCount, Count: 1, Attrs: map[string]string{finding.AttrFound: "3"}}
	links := finding.Finding{ID: "l", Detector: finding.DetectorNVLinkInactive, GPUPCI: "0000:10:1c.0", Count: 2, Attrs: map[string]string{finding.AttrLinks: "0,1"}}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if h := diagnose.Headline(eng.Diagnose(diagnose.Input{Node: "n", Findings: []finding.Finding{count}, Now: now, InstanceType: "onprem-a100x4"})); h.Reason != catalog.ReasonGPULost {
		t.Errorf("3 of 4 GPUs on onprem-a100x4: %s, want GPULost", h.Reason)
	}
	if h := diagnose.Headline(eng.Diagnose(diagnose.Input{Node: "n", Findings: []finding.Finding{links}, Now: now, InstanceType: "p4d.24xlarge"})); h.Reason != catalog.ReasonNVLinkNotApplicable {
		t.Errorf("links down on p4d.24xlarge overridden to no NVLink: %s, want NVLinkNotApplicable", h.Reason)
	}
	if got := (*policy.Policy)(nil).InstanceTypeOverrides(); got != nil {
		t.Errorf("nil policy overrides %v", got)
	}
}

// TestGPULostBareMetal: Xid 79 replaces in the cloud (catalog GPULost,
// case c01); a bare-metal fleet, where a replacement is an RMA, reboots
// first by policy: the action is the policy's, the catalog keeps its
// escalation text.
func TestGPULostBareMetal(t *testing.T) {
	t.Parallel()
	c := catalog.Default()
	p, err := policy.Parse([]byte("reasons:\n  GPULost: {action: reboot}\n"), c)
	if err != nil {
		t.Fatal(err)
	}
	lost := c.MustLookup(catalog.ReasonGPULost)
	if lost.Action != catalog.ActionReplace {
		t.Fatalf("catalog GPULost action %s, want replace (xid-actions: REPLACE in the cloud; c01)", lost.Action)
	}
	if e := p.Resolve(lost, "metal", lost.Action); e.Action != catalog.ActionReboot {
		t.Errorf("bare-metal policy action %s, want reboot", e.Action)
	}
}
