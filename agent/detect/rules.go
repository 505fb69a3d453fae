package detect

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

//go:embed rules.yaml
var defaultRulesYAML []byte

// DefaultRulesYAML returns the embedded rules file, for documentation and for
// operators who want a starting point for an override file.
func DefaultRulesYAML() []byte { return slices.Clone(defaultRulesYAML) }

var defaultRules = sync.OnceValues(func() (*Rules, error) { return ParseRules(defaultRulesYAML) })

// DefaultRules returns the embedded rules, parsed and compiled once. It panics
// if the embedded file is broken, which the package tests rule out.
func DefaultRules() *Rules {
	r, err := defaultRules()
	if err != nil {
		panic(fmt.Sprintf("detect: embedded rules.yaml: %v", err))
	}
	return r
}

// Rules is a compiled rules file (rules.yaml): the settings of the code
// detectors (Xid, AER) and the pattern rules of the simple detectors. Rules
// are immutable once parsed and may be shared by any number of Detectors.
type Rules struct {
	Xid   XidConfig   `json:"xid"`
	AER   AERConfig   `json:"aer"`
	SXid  SXidConfig  `json:"sxid"`
	Stack StackConfig `json:"stack"`
	Rules []*Rule     `json:"rules"`

	group, secondary map[int]bool
	// gates are the distinct literal lead-ins ("NVRM: ") that every match
	// of some rules begins with; a message without a gate skips all its
	// rules with one search instead of one per rule.
	gates []string
}

// XidConfig tunes the Xid parser.
type XidConfig struct {
	// Group lists the Xids the driver prints as several lines per event
	// (Xid 13). Lines of one GPU, Xid and pid within GroupWindow of each
	// other form one event (Finding.Count 1, attr lines = N).
	Group []int `json:"group"`
	// GroupWindow is the largest kernel-time gap between two lines of one
	// event. When neither line has a time, only consecutive lines group.
	GroupWindow Duration `json:"group_window"`
	// Secondary lists Xids that are consequences of another error (Xid 45):
	// their findings carry attr secondary=true.
	Secondary []int `json:"secondary"`
}

// AERConfig tunes the PCIe AER assembler.
type AERConfig struct {
	// Window is the largest kernel-time gap between two lines of one AER
	// report. When the lines have no time, a line that is not part of the
	// report ends it.
	Window Duration `json:"window"`
}

// SXidConfig tunes the NVSwitch SXid assembler.
type SXidConfig struct {
	// Window is the largest kernel-time gap between the lines of one SXid
	// event (summary, engine, Data).
	Window Duration `json:"window"`
}

// StackConfig tunes the assembler of kernel reports that carry a stack
// (hung task, soft lockup, RCU stall).
type StackConfig struct {
	// Window is the largest kernel-time gap between two lines of one report.
	Window Duration `json:"window"`
	// GPUModules are the kernel modules whose frames make a report the GPU
	// driver's (attr module).
	GPUModules []string `json:"gpu_modules"`
}

// Rule is one pattern rule of a simple detector. See rules.yaml for the
// meaning of each field.
type Rule struct {
	Name     string            `json:"name"`
	Detector string            `json:"detector"`
	Contains Literals          `json:"contains"`
	Gate     string            `json:"gate,omitempty"`
	Pattern  string            `json:"pattern"`
	Attrs    map[string]string `json:"attrs,omitempty"`
	Attach   bool              `json:"attach,omitempty"`
	Window   Duration          `json:"window,omitzero"`
	Samples  Samples           `json:"samples"`

	re   *regexp.Regexp
	gate int // index in Rules.gates, -1 none
}

// Literals is a rule's contains: one literal, or a list of alternatives
// (every match contains at least one), written as a string or a list.
type Literals []string

// UnmarshalJSON reads a string or a list of strings.
func (l *Literals) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = Literals{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("parse contains: want a string or a list of strings: %w", err)
	}
	*l = many
	return nil
}

// in reports whether msg contains one of the literals.
func (l Literals) in(msg string) bool {
	for _, s := range l {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// Samples are the lines a Rule is checked against.
type Samples struct {
	Match   []Sample `json:"match"`
	NoMatch []string `json:"no_match"`
}

// Sample is a line a Rule must match, and the facts it must give (gpu_pci,
// device_pci and attribute keys; keys not listed are not checked).
type Sample struct {
	Line string            `json:"line"`
	Want map[string]string `json:"want"`
}

// Duration is a time.Duration written as a Go duration string ("1s", "500ms")
// in the rules file.
type Duration struct{ time.Duration }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("parse duration: want a string such as \"1s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("parse duration: %w", err)
	}
	if v < 0 {
		return fmt.Errorf("parse duration %q: negative", s)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// LoadRules reads a rules file that replaces the embedded rules as a whole
// (start from DefaultRulesYAML).
func LoadRules(path string) (*Rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load rules: %w", err)
	}
	r, err := ParseRules(data)
	if err != nil {
		return nil, fmt.Errorf("load rules %s: %w", path, err)
	}
	return r, nil
}

// ParseRules parses, validates and compiles a rules file. Unknown keys are
// errors (a typo must not silently disable a rule), and so is any rule whose
// samples do not behave (Check).
func ParseRules(data []byte) (*Rules, error) {
	var r Rules
	if err := yaml.UnmarshalStrict(data, &r); err != nil {
		return nil, fmt.Errorf("parse rules: %w", err)
	}
	if r.Xid.GroupWindow.Duration == 0 {
		r.Xid.GroupWindow.Duration = time.Second
	}
	if r.AER.Window.Duration == 0 {
		r.AER.Window.Duration = 2 * time.Second
	}
	if r.SXid.Window.Duration == 0 {
		r.SXid.Window.Duration = time.Second
	}
	if r.Stack.Window.Duration == 0 {
		r.Stack.Window.Duration = 2 * time.Second
	}
	r.group, r.secondary = map[int]bool{}, map[int]bool{}
	for _, x := range r.Xid.Group {
		r.group[x] = true
	}
	for _, x := range r.Xid.Secondary {
		r.secondary[x] = true
	}
	var problems []string
	seen := map[string]bool{}
	for i, rule := range r.Rules {
		at := fmt.Sprintf("rules[%d]", i)
		if rule == nil {
			problems = append(problems, at+": empty")
			continue
		}
		if rule.Name == "" {
			problems = append(problems, at+".name: required")
		} else if seen[rule.Name] {
			problems = append(problems, fmt.Sprintf("%s.name: %q used twice", at, rule.Name))
		}
		seen[rule.Name] = true
		if rule.Detector == "" {
			problems = append(problems, at+".detector: required")
		}
		if rule.Detector == finding.DetectorXid {
			problems = append(problems, at+".detector: \"xid\" lines are parsed by code, not by rules")
		}
		if len(rule.Contains) == 0 || slices.Contains(rule.Contains, "") {
			problems = append(problems, at+".contains: required (a literal every match contains)")
		}
		re, err := regexp.Compile(rule.Pattern)
		if err != nil || rule.Pattern == "" {
			problems = append(problems, fmt.Sprintf("%s.pattern: does not compile: %v", at, err))
			continue
		}
		rule.re = re
		rule.gate = -1
		// The gate is the rule's explicit gate, or else the literal start
		// of every match up to its first ": ", e.g. "NVRM: " for the
		// driver's messages.
		g := rule.Gate
		if prefix, _ := re.LiteralPrefix(); g == "" && strings.Contains(prefix, ": ") {
			g = prefix[:strings.Index(prefix, ": ")+2]
		}
		if g != "" {
			rule.gate = slices.Index(r.gates, g)
			if rule.gate < 0 {
				rule.gate = len(r.gates)
				r.gates = append(r.gates, g)
			}
		}
		if rule.Window.Duration == 0 {
			rule.Window.Duration = time.Second
		}
		if len(rule.Samples.Match) == 0 || len(rule.Samples.NoMatch) == 0 {
			problems = append(problems, at+".samples: need at least one match and one no_match line")
		}
	}
	if len(problems) == 0 {
		problems = r.check()
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("check rules: %w", &RulesError{Problems: problems})
	}
	return &r, nil
}

// RulesError lists every problem of a rules file.
type RulesError struct{ Problems []string }

// Error joins the problems with "; ".
func (e *RulesError) Error() string { return strings.Join(e.Problems, "; ") }

// check runs every rule on its own samples.
func (r *Rules) check() []string {
	var problems []string
	for _, rule := range r.Rules {
		for _, s := range rule.Samples.Match {
			if rule.gate >= 0 && !strings.Contains(s.Line, r.gates[rule.gate]) {
				problems = append(problems, fmt.Sprintf("rule %q: sample %q lacks its gate %q", rule.Name, s.Line, r.gates[rule.gate]))
				continue
			}
			m, ok := rule.match(s.Line)
			if !ok {
				problems = append(problems, fmt.Sprintf("rule %q: does not match its sample %q", rule.Name, s.Line))
				continue
			}
			for k, want := range s.Want {
				if got := m.get(k); got != want {
					problems = append(problems, fmt.Sprintf("rule %q: sample %q gives %s=%q, want %q", rule.Name, s.Line, k, got, want))
				}
			}
		}
		for _, line := range rule.Samples.NoMatch {
			if _, ok := rule.match(line); ok {
				problems = append(problems, fmt.Sprintf("rule %q: matches its no_match sample %q", rule.Name, line))
			}
		}
	}
	return problems
}

// ruleMatch holds the facts one rule read from one message.
type ruleMatch struct {
	gpu, device string
	attrs       map[string]string
}

func (m ruleMatch) get(k string) string {
	switch k {
	case "gpu_pci":
		return m.gpu
	case "device_pci":
		return m.device
	}
	return m.attrs[k]
}

// match tries the rule on one message. The cheap Contains test runs first.
func (rule *Rule) match(msg string) (ruleMatch, bool) {
	if !rule.Contains.in(msg) {
		return ruleMatch{}, false
	}
	sub := rule.re.FindStringSubmatch(msg)
	if sub == nil {
		return ruleMatch{}, false
	}
	m := ruleMatch{attrs: make(map[string]string, len(rule.Attrs)+2)}
	for k, v := range rule.Attrs {
		m.attrs[k] = v
	}
	for i, name := range rule.re.SubexpNames() {
		if name == "" || sub[i] == "" {
			continue
		}
		switch name {
		case "gpu_pci", "device_pci":
			pci, err := finding.NormalizePCI(sub[i])
			if err != nil {
				continue
			}
			if name == "gpu_pci" {
				m.gpu = pci
			} else {
				m.device = pci
			}
		default:
			m.attrs[name] = sub[i]
		}
	}
	return m, true
}
