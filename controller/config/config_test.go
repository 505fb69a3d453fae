package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/config"
)

// TestDefaults: an empty file is the defaults, and the defaults are the
// breaker package's and a valid configuration.
func TestDefaults(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{"", "# nothing\n", "{}\n"} {
		c, err := config.Parse([]byte(doc), nil)
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		if !reflect.DeepEqual(c, config.Default()) {
			t.Errorf("Parse(%q) = %+v, want the defaults %+v", doc, c, config.Default())
		}
	}
	d := config.Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	bp, err := d.BreakerPolicy()
	if err != nil {
		t.Fatal(err)
	}
	zero, _ := breaker.NewPolicy(breaker.Config{})
	if !reflect.DeepEqual(bp.Config(), zero.Config()) {
		t.Errorf("default breaker config %+v, want breaker's own defaults %+v", bp.Config(), zero.Config())
	}
	if got := d.Repair.BreakerAge(); got != 30*time.Second {
		t.Errorf("default max breaker age %s, want 30s (3 x 10s resync, at least 30s)", got)
	}
}

// TestParse: a file sets what it names and keeps the defaults of the rest;
// label cohorts reach the breaker configuration.
func TestParse(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`
breaker:
  labels: [topology.kubernetes.io/rack, nvidia.com/nvlink-domain]
  window: 5m
  minFailing: 4
budgets:
  maxInFlightPerNodePool: 2
  minHealthy: 3
repair:
  resync: 20s
  approvalTTL: 2h
policy:
  reasons:
    GPUHang: {action: replace}
  nodePools:
    small: {minHealthy: 0}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	bc := c.Breaker.BreakerConfig()
	if !slices.Equal(bc.Labels, []string{"topology.kubernetes.io/rack", "nvidia.com/nvlink-domain"}) || bc.Window != 5*time.Minute || bc.MinFailing != 4 {
		t.Errorf("breaker config %+v", bc)
	}
	if bc.CoolDown != 0 || bc.Alpha != breaker.DefaultAlpha {
		t.Errorf("unset breaker keys lost their defaults: %+v", bc)
	}
	if b := c.Budget("gpu"); b.MaxInFlightPerNodePool != 2 || b.DeletionsPerHour != 10 || b.NodePoolDeletionsPerHour != 5 || b.MinHealthy != 3 {
		t.Errorf("budget %+v", b)
	}
	if m := c.MinHealthy("small"); m != 0 {
		t.Errorf("nodePools.small.minHealthy 0 should opt out of budgets.minHealthy, got %d", m)
	}
	if p := c.ResolvedPolicy(); p.MinHealthy("gpu") != 3 || p.MinHealthy("small") != 0 {
		t.Errorf("resolved policy min healthy gpu %d small %d, want 3 and 0", p.MinHealthy("gpu"), p.MinHealthy("small"))
	}
	if c.Repair.Resync != 20*time.Second || c.Repair.ApprovalTTL != 2*time.Hour || c.Repair.BreakerAge() != time.Minute || c.Repair.Lookback != config.DefaultLookback {
		t.Errorf("repair %+v", c.Repair)
	}
}

// TestParseRefuses: a typo, a wrong type, a bad value or a policy mistake
// is refused with the line it is on.
func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ doc, want string }{
		{"budgets:\n  deletionPerHour: 3\n", "line 2: unknown key deletionPerHour"},
		{"breaker:\n  window: 5m\n  lables: [rack]\n", "line 3: unknown key lables"},
		{"repairs:\n  resync: 5s\n", "line 1: unknown key repairs"},
		{"repair:\n  resync: 10\n", "line 2: cannot unmarshal !!int `10` into time.Duration"},
		{"repair:\n  resync: soon\n", "line 2"},
		{"budgets:\n  deletionsPerHour: many\n", "line 2"},
		{"budgets:\n\n  deletionsPerHour: -1\n", "line 3: budgets.deletionsPerHour: must be >= 0"},
		{"repair:\n  resync: 0s\n", "line 2: repair.resync: must be > 0"},
		{"breaker:\n  minFailing: 1\n", "line 2: breaker: validate breaker config: minimum failing nodes must be >= 2"},
		{"breaker:\n  labels: [\"rack zone\"]\n", "line 2: breaker.labels: labels[0]"},
		{"policy:\n  reasons:\n    GPUHangs: {action: replace}\n", "line 3: policy.reasons.GPUHangs: unknown reason code"},
		{"policy:\n  reasons:\n    GPUHang: {acton: replace}\n", "line 3: unknown key acton"},
		{"policy:\n  reasons: {}\npolicyFile: p.yaml\n", "line 3: policy and policyFile"},
	} {
		_, err := config.Parse([]byte(tc.doc), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.doc, err, tc.want)
		}
	}
}

// TestLoadPolicyFile: policyFile is read relative to the configuration's
// directory and its errors name it.
func TestLoadPolicyFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("policy.yaml", "reasons:\n  GPUHang: {action: replace}\n")
	c, err := config.Load(write("config.yaml", "policyFile: policy.yaml\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy == nil || c.Policy.Reasons["GPUHang"].Action != "replace" {
		t.Errorf("policy %+v, want policy.yaml's", c.Policy)
	}
	write("bad.yaml", "reasons:\n  Nope: {}\n")
	if _, err := config.Load(write("config2.yaml", "policyFile: bad.yaml\n"), nil); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Errorf("bad policy file: %v, want an error naming it", err)
	}
	if _, err := config.Load(filepath.Join(dir, "missing.yaml"), nil); err == nil {
		t.Error("missing file: no error")
	}
}

// TestExample: the shipped example configuration parses and sets a label
// cohort (deploy/config.example.yaml).
func TestExample(t *testing.T) {
	t.Parallel()
	c, err := config.Load("../../deploy/config.example.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Breaker.Labels) == 0 || c.Policy == nil {
		t.Errorf("example sets no label cohort or no policy: %+v", c)
	}
}

// TestDocsListEveryKey: docs/config.md has a row (or section) for every key
// of the file, so a new setting cannot ship undocumented.
func TestDocsListEveryKey(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(prefix string, typ reflect.Type)
	walk = func(prefix string, typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if key == "" || key == "-" {
				continue
			}
			if !strings.Contains(string(doc), "`"+key+"`") {
				t.Errorf("docs/config.md does not document %s%s", prefix, key)
			}
			if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == typ.PkgPath() {
				walk(prefix+key+".", f.Type)
			}
		}
	}
	walk("", reflect.TypeOf(config.Config{}))
}
