package detect

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// TestShippedRules checks every rule of the embedded rules.yaml against its
// own samples: each has a line it must match (with the facts it must give)
// and one it must not, and its prefilter literal is in every matching line.
func TestShippedRules(t *testing.T) {
	t.Parallel()
	rules := DefaultRules()
	if len(rules.Rules) == 0 {
		t.Fatal("no shipped rules")
	}
	for _, rule := range rules.Rules {
		t.Run(rule.Name, func(t *testing.T) {
			t.Parallel()
			if len(rule.Samples.Match) == 0 || len(rule.Samples.NoMatch) == 0 {
				t.Fatalf("rule %q needs a matching and a non-matching sample", rule.Name)
			}
			for _, s := range rule.Samples.Match {
				if !rule.Contains.in(s.Line) {
					t.Errorf("sample %q lacks the prefilter literal %q", s.Line, rule.Contains)
				}
				m, ok := rule.match(s.Line)
				if !ok {
					t.Errorf("does not match %q", s.Line)
					continue
				}
				for k, want := range s.Want {
					if got := m.get(k); got != want {
						t.Errorf("%q: %s = %q, want %q", s.Line, k, got, want)
					}
				}
				// Through a whole Detector too: the sample gives a finding
				// of the rule's detector (attach rules at Flush).
				d := New(Options{})
				got := append(d.Feed(kmsg.Record{Message: s.Line, Raw: s.Line, Usec: -1}), d.Flush()...)
				if len(got) != 1 || got[0].Detector != rule.Detector {
					t.Errorf("Detector on %q = %+v, want one %s finding", s.Line, got, rule.Detector)
				}
			}
			for _, line := range rule.Samples.NoMatch {
				if _, ok := rule.match(line); ok {
					t.Errorf("matches its no_match sample %q", line)
				}
			}
		})
	}
}

func TestParseRulesErrors(t *testing.T) {
	t.Parallel()
	valid := `
rules:
  - name: r
    detector: gsp-error
    contains: boom
    pattern: 'boom (?P<gpu_index>\d+)'
    samples:
      match: [{line: "boom 1", want: {gpu_index: "1"}}]
      no_match: ["bang"]
`
	if _, err := ParseRules([]byte(valid)); err != nil {
		t.Fatalf("valid rules: %v", err)
	}
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"unknown key", strings.Replace(valid, "contains:", "contain:", 1), "unknown field"},
		{"bad regexp", strings.Replace(valid, `boom (?P<gpu_index>\d+)`, `boom (`, 1), "does not compile"},
		{"no contains", strings.Replace(valid, "contains: boom", "contains: ''", 1), "contains: required"},
		{"no samples", strings.Replace(valid, `no_match: ["bang"]`, `no_match: []`, 1), "at least one match and one no_match"},
		{"sample fails", strings.Replace(valid, `line: "boom 1"`, `line: "boom x"`, 1), "does not match its sample"},
		{"wrong facts", strings.Replace(valid, `gpu_index: "1"`, `gpu_index: "2"`, 1), `gpu_index="1", want "2"`},
		{"no_match matches", strings.Replace(valid, `["bang"]`, `["boom 3"]`, 1), "matches its no_match sample"},
		{"xid by rule", strings.Replace(valid, "detector: gsp-error", "detector: xid", 1), "parsed by code"},
		{"duplicate names", valid + strings.TrimPrefix(valid[strings.Index(valid, "  - name"):], ""), "used twice"},
		{"bad duration", "xid:\n  group_window: soon\n", "parse duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseRules([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseRules error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestLoadRulesOverride(t *testing.T) {
	t.Parallel()
	// The embedded file, written out, is a valid override file.
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, DefaultRulesYAML(), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := LoadRules(path)
	if err != nil {
		t.Fatalf("LoadRules: %v", err)
	}
	if len(r.Rules) != len(DefaultRules().Rules) {
		t.Errorf("override has %d rules, want %d", len(r.Rules), len(DefaultRules().Rules))
	}
	// A file with one rule replaces the defaults as a whole.
	one := `
rules:
  - name: banner
    detector: driver-version
    contains: "NVRM: loading"
    pattern: 'NVRM: loading .* (?P<value>\d+\.\d+\.\d+)'
    samples:
      match: [{line: "NVRM: loading X 1.2.3", want: {value: "1.2.3"}}]
      no_match: ["NVRM: other"]
`
	if err := os.WriteFile(path, []byte(one), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err = LoadRules(path)
	if err != nil {
		t.Fatalf("LoadRules: %v", err)
	}
	d := New(Options{Rules: r})
	if got := d.Feed(kmsg.Record{Message: "NVRM: The NVIDIA probe routine failed for 1 device(s).", Usec: -1}); len(got) != 0 {
		t.Errorf("replaced rule still fires: %+v", got)
	}
	if got := d.Feed(kmsg.Record{Message: "NVRM: loading X 1.2.3", Usec: -1}); len(got) != 1 || got[0].Attr(finding.AttrValue) != "1.2.3" {
		t.Errorf("override rule: %+v", got)
	}
	if _, err := LoadRules(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadRules(missing) error = %v, want ErrNotExist", err)
	}
}
