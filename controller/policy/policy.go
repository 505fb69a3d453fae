// Package policy holds operator overrides of the reason catalog's defaults,
// per reason and per NodePool: toleration, the action to execute, or the
// reason disabled. It is read from a YAML file at start; decoding is strict
// (unknown keys are errors) and every error names the file and line.
//
//	reasons:
//	  GPUHang: {toleration: 5m, action: replace}   # replace on a first hang
//	  PCIeCorrectableErrors: {disabled: true}
//	nodePools:
//	  inference-small:
//	    toleration: 2m                             # every reason in this pool
//	    minHealthy: 2                              # never below 2 healthy nodes
//	    reasons:
//	      GPULost: {toleration: 0s}
//	instanceTypes:                                 # per-SKU expectations (diagnose.DefaultInstanceTypes)
//	  p5.48xlarge: {gpus: 8, nvlinks: 18, nvswitch: true}
//	  my-onprem-a100x4: {gpus: 4, nvlinks: 12}
//
// Precedence, most specific first: nodePools.<pool>.reasons.<code>,
// nodePools.<pool> (toleration only), reasons.<code>, the catalog.
package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

// Override changes one reason's defaults. Zero fields keep the default.
type Override struct {
	// Toleration replaces the catalog toleration (Go duration, e.g. "5m").
	Toleration *Duration `yaml:"toleration"`
	// Action is the action to execute when the toleration ends, instead of
	// the recommended one (e.g. replace on a first reset-class fault).
	Action catalog.Action `yaml:"action"`
	// Disabled turns the reason off: no condition, no taint, no repair; the
	// diagnosis is still recorded as an event.
	Disabled bool `yaml:"disabled"`
}

// NodePool holds the overrides of one NodePool.
type NodePool struct {
	Toleration *Duration           `yaml:"toleration"`
	Reasons    map[string]Override `yaml:"reasons"`
	// MinHealthy is the least number of healthy Nodes (Ready, not
	// quarantined) the NodePool must keep: below it no repair of the pool
	// deletes anything (a pool that is mostly broken points at a shared
	// cause). Unset: the policy's DefaultMinHealthy (the controller
	// configuration's budgets.minHealthy, default 0: none); 0 opts the
	// NodePool out of a fleet-wide default.
	MinHealthy *int `yaml:"minHealthy"`
}

// MinHealthy returns the NodePool's minimum healthy count: its own
// minHealthy, else DefaultMinHealthy (0: none).
func (p *Policy) MinHealthy(nodePool string) int {
	if p == nil {
		return 0
	}
	if m := p.NodePools[nodePool].MinHealthy; m != nil {
		return *m
	}
	return p.DefaultMinHealthy
}

// Policy is a validated policy file. The zero value (or nil) changes nothing.
type Policy struct {
	Reasons   map[string]Override `yaml:"reasons"`
	NodePools map[string]NodePool `yaml:"nodePools"`
	// InstanceTypes override or extend the diagnosis's per-instance-type
	// expectations (GPU count, NVLinks wired per GPU, NVSwitch), by
	// instance type (node.kubernetes.io/instance-type); an entry replaces
	// the default one whole.
	InstanceTypes map[string]diagnose.InstanceType `yaml:"instanceTypes"`
	// DefaultMinHealthy is the minimum healthy count of every NodePool
	// without its own minHealthy. It is not a key of the policy file: the
	// controller configuration sets it from budgets.minHealthy
	// (controller/config).
	DefaultMinHealthy int `yaml:"-"`
}

// InstanceTypeOverrides returns the policy's instance types for
// diagnose.Options.InstanceTypes; nil for a nil policy.
func (p *Policy) InstanceTypeOverrides() map[string]diagnose.InstanceType {
	if p == nil {
		return nil
	}
	return p.InstanceTypes
}

// Duration is a time.Duration written as a Go duration string.
type Duration struct{ time.Duration }

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: %q is not a non-negative duration (e.g. 90s, 10m)", n.Line, n.Value)
	}
	d.Duration = v
	return nil
}

// Effective is the resolved policy for one reason in one NodePool.
type Effective struct {
	Toleration time.Duration
	Action     catalog.Action // the action to execute
	Disabled   bool
}

// Load reads and validates a policy file against the catalog. Errors name
// the file and, where known, the line.
func Load(path string, c *catalog.Catalog) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	p, err := Parse(b, c)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	return p, nil
}

// Parse decodes and validates policy YAML against the catalog.
func Parse(data []byte, c *catalog.Catalog) (*Policy, error) {
	var p Policy
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil && !errors.Is(err, io.EOF) { // io.EOF: empty file, empty policy
		return nil, fmt.Errorf("decode: %w", err)
	}
	if err := p.Validate(c, &root); err != nil {
		return nil, err
	}
	return &p, nil
}

// Validate checks a decoded policy against the catalog: known reason
// codes and actions, toleration and action on condition-severity reasons
// only, minHealthy >= 0. root is the YAML document the policy was decoded
// from and at the path of the policy's mapping inside it (none: the
// document itself; the controller configuration's inline policy is at
// "policy"); errors name that line and the key path below at.
func (p *Policy) Validate(c *catalog.Catalog, root *yaml.Node, at ...string) error {
	if p == nil {
		return nil
	}
	line := func(path ...string) int { return LineOf(root, append(append([]string(nil), at...), path...)...) }
	prefix := ""
	for _, a := range at {
		prefix += a + "."
	}
	for code, o := range p.Reasons {
		if err := check(c, code, o); err != nil {
			return fmt.Errorf("line %d: %sreasons.%s: %w", line("reasons", code), prefix, code, err)
		}
	}
	for name, it := range p.InstanceTypes {
		if err := it.Validate(); err != nil {
			return fmt.Errorf("line %d: %sinstanceTypes.%s: %w", line("instanceTypes", name), prefix, name, err)
		}
	}
	for pool, np := range p.NodePools {
		if np.MinHealthy != nil && *np.MinHealthy < 0 {
			return fmt.Errorf("line %d: %snodePools.%s.minHealthy: must be >= 0", line("nodePools", pool, "minHealthy"), prefix, pool)
		}
		for code, o := range np.Reasons {
			if err := check(c, code, o); err != nil {
				return fmt.Errorf("line %d: %snodePools.%s.reasons.%s: %w", line("nodePools", pool, "reasons", code), prefix, pool, code, err)
			}
		}
	}
	return nil
}

func check(c *catalog.Catalog, code string, o Override) error {
	r, ok := c.Lookup(code)
	if !ok {
		return fmt.Errorf("unknown reason code (catalog %s)", c.Version)
	}
	if o.Action != "" && o.Action.Rank() == 0 && o.Action != catalog.ActionNone {
		return fmt.Errorf("unknown action %q", o.Action)
	}
	if r.Severity != catalog.SeverityCondition && (o.Action != "" || o.Toleration != nil) {
		return fmt.Errorf("toleration and action apply to condition-severity reasons only (%s is %s)", code, r.Severity)
	}
	return nil
}

// LineOf returns the line of the YAML node at path (keys of nested
// mappings) below n, or of the deepest one found: how the policy file and
// the controller configuration (controller/config) name the line of an
// error.
func LineOf(n *yaml.Node, path ...string) int {
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, key := range path {
		if n.Kind != yaml.MappingNode {
			return n.Line
		}
		found := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				n, found = n.Content[i+1], true
				break
			}
		}
		if !found {
			return n.Line
		}
	}
	return n.Line
}

// Resolve returns the effective policy for a reason in a NodePool, from the
// catalog reason r and its recommended action.
func (p *Policy) Resolve(r catalog.Reason, nodePool string, recommended catalog.Action) Effective {
	e := Effective{Toleration: r.TolerationDuration(), Action: recommended}
	if p == nil {
		return e
	}
	apply := func(o Override) {
		if o.Toleration != nil {
			e.Toleration = o.Toleration.Duration
		}
		if o.Action != "" {
			e.Action = o.Action
		}
		e.Disabled = e.Disabled || o.Disabled
	}
	if o, ok := p.Reasons[r.Code]; ok {
		apply(o)
	}
	if np, ok := p.NodePools[nodePool]; ok {
		if np.Toleration != nil {
			e.Toleration = np.Toleration.Duration
		}
		if o, ok := np.Reasons[r.Code]; ok {
			apply(o)
		}
	}
	return e
}

// ForDiagnosis resolves the policy for a diagnosis in a NodePool. A
// positive tolerationOverride (demos, tests) replaces every toleration. A
// reason missing from the catalog keeps the diagnosis's own values.
func (p *Policy) ForDiagnosis(cat *catalog.Catalog, d diagnose.Diagnosis, nodePool string, tolerationOverride time.Duration) Effective {
	e := Effective{Toleration: d.Toleration(), Action: d.Action}
	if reason, ok := cat.Lookup(d.Reason); ok {
		e = p.Resolve(reason, nodePool, d.Action)
	}
	if tolerationOverride > 0 {
		e.Toleration = tolerationOverride
	}
	return e
}

// Apply turns condition diagnoses whose reason the policy disables into
// events (no condition, no taint, no repair) and keeps the live conditions
// first, so the headline is one of them.
func (p *Policy) Apply(cat *catalog.Catalog, ds []diagnose.Diagnosis, nodePool string) []diagnose.Diagnosis {
	if p == nil {
		return ds
	}
	var cond, rest []diagnose.Diagnosis
	for _, d := range ds {
		if d.Severity == catalog.SeverityCondition && p.ForDiagnosis(cat, d, nodePool, 0).Disabled {
			d.Severity, d.ConditionType = catalog.SeverityEvent, ""
			d.Message += " (repair disabled by policy)"
		}
		if d.Severity == catalog.SeverityCondition {
			cond = append(cond, d)
		} else {
			rest = append(rest, d)
		}
	}
	return append(cond, rest...)
}
