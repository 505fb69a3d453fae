// Package catalog loads the reason catalog (reasons.yaml): the versioned list
// of every ReasonCode a Diagnosis can carry, with its condition type, severity,
// fault class, default action and toleration (docs/design.md, decision 3).
//
// The catalog is data, embedded at build time; Default returns it. Reason
// codes are an API contract: see reasons.yaml for the rules.
package catalog

import (
	"bytes"
	_ "embed"
	"fmt"
	"regexp"
	"sort"
	"time"

	"sigs.k8s.io/yaml"
)

//go:embed reasons.yaml
var defaultYAML []byte

// Severity says what a diagnosis does on the cluster.
type Severity string

// Severities, from most to least consequential.
const (
	SeverityCondition Severity = "condition" // NodeCondition set; repair may follow
	SeverityEvent     Severity = "event"     // a Kubernetes Event only
	SeverityNone      Severity = "none"      // metrics only
)

// Rank orders severities: condition > event > none.
func (s Severity) Rank() int {
	switch s {
	case SeverityCondition:
		return 2
	case SeverityEvent:
		return 1
	}
	return 0
}

// Action is a remedy, from least to most disruptive (docs/design.md, decision 6b).
type Action string

// Actions.
const (
	ActionNone                Action = "none"
	ActionRestartDevicePlugin Action = "restart-device-plugin"
	ActionRestartRuntime      Action = "restart-runtime"
	ActionResetGPU            Action = "reset-gpu"
	ActionReboot              Action = "reboot"
	ActionReplace             Action = "replace"
)

// Rank orders actions by disruption: none < restart-* < reset-gpu < reboot < replace.
func (a Action) Rank() int {
	switch a {
	case ActionRestartDevicePlugin:
		return 1
	case ActionRestartRuntime:
		return 2
	case ActionResetGPU:
		return 3
	case ActionReboot:
		return 4
	case ActionReplace:
		return 5
	}
	return 0
}

func validAction(a Action) bool { return a == ActionNone || a.Rank() > 0 }

// FaultClasses lists the fault classes of the case corpus (cases/README.md),
// plus node-os (the node's kernel and filesystems) and storage (a data
// volume, not the node), added in catalog 1.1.0.
var FaultClasses = []string{"gpu-lost", "pcie", "memory-uncorrectable", "nvlink", "gpu-hang",
	"gpu-firmware", "app-error", "driver-regression", "device-plugin", "runtime", "network",
	"monitoring-plane", "provisioning", "node-os", "storage", "none"}

// SoftwareClasses are the fault classes of software a node runs rather
// than its hardware: a new node from the same image has the same fault, so
// no reason of theirs may replace a node (catalog_test enforces it).
var SoftwareClasses = map[string]bool{"driver-regression": true, "monitoring-plane": true, "provisioning": true}

// acceleratedClasses are the fault classes of accelerated hardware, whose
// default toleration is DefaultAcceleratedToleration (docs/design.md, decision 4).
var acceleratedClasses = map[string]bool{"gpu-lost": true, "pcie": true,
	"memory-uncorrectable": true, "nvlink": true, "gpu-hang": true, "gpu-firmware": true}

// Default tolerations (docs/design.md, decision 4).
const (
	DefaultAcceleratedToleration = 10 * time.Minute
	DefaultOtherToleration       = 30 * time.Minute
)

// Reason is one catalog entry.
type Reason struct {
	Code          string   `json:"code"`
	ConditionType string   `json:"conditionType,omitempty"`
	Severity      Severity `json:"severity"`
	FaultClass    string   `json:"faultClass"`
	Action        Action   `json:"action"`
	EscalateTo    Action   `json:"escalateTo,omitempty"`
	Urgency       string   `json:"urgency,omitempty"`
	// Toleration is a Go duration string; empty means the fault class default.
	Toleration string `json:"toleration,omitempty"`
	Priority   int    `json:"priority,omitempty"`
	// RebootDeadline (a Go duration) bounds a reboot action: a graceful
	// reboot that has not completed by then is replaced by Fallback. Set
	// for faults where the shutdown itself can hang (a task stuck in the
	// GPU driver's lock). Empty: no deadline of the catalog's own.
	RebootDeadline string `json:"rebootDeadline,omitempty"`
	// Fallback is what follows a reboot past RebootDeadline: "power-cycle"
	// (a forced reboot or power cycle; cloud - stop or terminate the
	// instance).
	Fallback    string `json:"fallback,omitempty"`
	Since       string `json:"since"`
	Deprecated  bool   `json:"deprecated,omitempty"`
	ReplacedBy  string `json:"replacedBy,omitempty"`
	Description string `json:"description"`
	Runbook     string `json:"runbook"`

	toleration     time.Duration
	rebootDeadline time.Duration
}

// RebootDeadlineDuration is RebootDeadline parsed; 0 when unset.
func (r Reason) RebootDeadlineDuration() time.Duration { return r.rebootDeadline }

// TolerationDuration is how long a condition with this reason must persist
// before its repair is executed.
func (r Reason) TolerationDuration() time.Duration { return r.toleration }

// Catalog is a validated reason catalog.
type Catalog struct {
	Version string   `json:"version"`
	Reasons []Reason `json:"reasons"`

	byCode map[string]Reason
}

var (
	codeRE   = regexp.MustCompile(`^[A-Z][A-Za-z0-9]+$`)
	semverRE = regexp.MustCompile(`^\d+\.\d+\.\d+$`)
)

// Parse decodes and validates a catalog. Unknown fields are errors. It
// returns an error naming the first offending entry.
func Parse(data []byte) (*Catalog, error) {
	var c Catalog
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("decode reason catalog: %w", err)
	}
	if !semverRE.MatchString(c.Version) {
		return nil, fmt.Errorf("validate reason catalog: version %q is not MAJOR.MINOR.PATCH", c.Version)
	}
	c.byCode = make(map[string]Reason, len(c.Reasons))
	for i := range c.Reasons {
		r := &c.Reasons[i]
		at := fmt.Sprintf("reasons[%d] (%s)", i, r.Code)
		switch {
		case !codeRE.MatchString(r.Code):
			return nil, fmt.Errorf("validate reason catalog: %s: code must be CamelCase", at)
		case c.byCode[r.Code].Code != "":
			return nil, fmt.Errorf("validate reason catalog: %s: duplicate code", at)
		case r.Severity.Rank() == 0 && r.Severity != SeverityNone:
			return nil, fmt.Errorf("validate reason catalog: %s: severity %q is not condition, event or none", at, r.Severity)
		case !validAction(r.Action) || r.EscalateTo != "" && !validAction(r.EscalateTo):
			return nil, fmt.Errorf("validate reason catalog: %s: unknown action", at)
		case r.Severity == SeverityCondition && r.ConditionType == "":
			return nil, fmt.Errorf("validate reason catalog: %s: condition severity needs a conditionType", at)
		case !semverRE.MatchString(r.Since):
			return nil, fmt.Errorf("validate reason catalog: %s: since %q is not MAJOR.MINOR.PATCH", at, r.Since)
		case r.Description == "" || r.Runbook == "":
			return nil, fmt.Errorf("validate reason catalog: %s: description and runbook are required", at)
		}
		if !contains(FaultClasses, r.FaultClass) {
			return nil, fmt.Errorf("validate reason catalog: %s: unknown fault class %q", at, r.FaultClass)
		}
		if SoftwareClasses[r.FaultClass] && (r.Action == ActionReplace || r.EscalateTo == ActionReplace) {
			return nil, fmt.Errorf("validate reason catalog: %s: fault class %s is software: a replacement gets the same fault", at, r.FaultClass)
		}
		r.toleration = DefaultOtherToleration
		if acceleratedClasses[r.FaultClass] {
			r.toleration = DefaultAcceleratedToleration
		}
		if r.Toleration != "" {
			d, err := time.ParseDuration(r.Toleration)
			if err != nil || d < 0 {
				return nil, fmt.Errorf("validate reason catalog: %s: toleration %q is not a duration", at, r.Toleration)
			}
			r.toleration = d
		}
		if r.RebootDeadline != "" {
			d, err := time.ParseDuration(r.RebootDeadline)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("validate reason catalog: %s: rebootDeadline %q is not a positive duration", at, r.RebootDeadline)
			}
			r.rebootDeadline = d
		}
		if (r.Fallback == "") != (r.RebootDeadline == "") || r.Fallback != "" && r.Fallback != "power-cycle" {
			return nil, fmt.Errorf("validate reason catalog: %s: fallback %q needs a rebootDeadline and must be power-cycle", at, r.Fallback)
		}
		c.byCode[r.Code] = *r
	}
	for _, r := range c.Reasons {
		if r.ReplacedBy != "" && c.byCode[r.ReplacedBy].Code == "" {
			return nil, fmt.Errorf("validate reason catalog: %s: replacedBy %q is not in the catalog", r.Code, r.ReplacedBy)
		}
	}
	return &c, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Default returns the embedded catalog. It panics only if the embedded file
// is invalid, which the package tests rule out.
func Default() *Catalog {
	c, err := Parse(defaultYAML)
	if err != nil {
		panic(err)
	}
	return c
}

// DefaultYAML returns the embedded catalog file, unchanged.
func DefaultYAML() []byte { return bytes.Clone(defaultYAML) }

// Lookup returns the reason with the given code.
func (c *Catalog) Lookup(code string) (Reason, bool) {
	r, ok := c.byCode[code]
	return r, ok
}

// MustLookup returns the reason with the given code and panics when it is
// missing: the diagnosis rules only name codes the catalog tests prove exist.
func (c *Catalog) MustLookup(code string) Reason {
	r, ok := c.byCode[code]
	if !ok {
		panic(fmt.Sprintf("reason %q is not in catalog %s", code, c.Version))
	}
	return r
}

// ConditionTypes returns the distinct NodeCondition types the catalog uses, sorted.
func (c *Catalog) ConditionTypes() []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range c.Reasons {
		if r.ConditionType != "" && !seen[r.ConditionType] {
			seen[r.ConditionType] = true
			out = append(out, r.ConditionType)
		}
	}
	sort.Strings(out)
	return out
}
