// Package config is the controller's one configuration: the cohort
// breakers, the deletion budgets, the repair timings and the policy
// overrides, read from one strict YAML file (docs/config.md) into one
// Config that the live reconciler (controller/repair, through cmd/runner),
// the shadow report (controller/shadow) and the simulator
// (controller/simulate) all receive, so their defaults cannot drift.
//
//	breaker:
//	  labels: [topology.kubernetes.io/rack]   # label cohorts
//	  window: 10m
//	budgets:
//	  deletionsPerHour: 10
//	  maxInFlightPerNodePool: 1
//	repair:
//	  resync: 10s
//	  approvalTTL: 24h
//	policy:                                   # or policyFile: policy.yaml
//	  reasons:
//	    GPUHang: {action: replace}
//
// Default is the one place the defaults are written. Parse starts from it,
// so a key the file leaves out keeps its default. Decoding is strict: an
// unknown key, a wrong type, a bad duration or a value out of range is an
// error naming the line. Flags override the file (cmd/fleetrepair:
// flag > environment > file > default).
//
// The package is pure apart from Load reading files: no network, database
// or Kubernetes imports (test/importrule).
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/policy"
)

// Config is the controller configuration. Use Default, Parse or Load: the
// zero value has every budget at 0 (no deletion at all) and breakers off.
type Config struct {
	// Breaker configures the cohort breakers (docs/breakers.md).
	Breaker Breaker `yaml:"breaker" json:"breaker"`
	// Budgets bound NodeClaim deletions (docs/design.md, decision 7).
	Budgets Budgets `yaml:"budgets" json:"budgets"`
	// Repair holds the repair ledger's timings.
	Repair Repair `yaml:"repair" json:"repair"`
	// Policy holds the operator overrides of the reason catalog
	// (docs/policy.md), inline; nil: none. Load reads PolicyFile into it.
	Policy *policy.Policy `yaml:"policy" json:"policy,omitempty"`
	// PolicyFile is a policy file (docs/policy.md) instead of an inline
	// policy; relative to the configuration file's directory. Setting both
	// is an error.
	PolicyFile string `yaml:"policyFile" json:"policyFile,omitempty"`
}

// Breaker is the cohort breakers' settings (breaker.Config; field docs
// there). Durations are Go durations ("10m"). The defaults are
// controller/breaker's.
type Breaker struct {
	// Enabled turns the breakers on (default true). Off, nothing holds a
	// repair for a shared cause: for tests of other parts only.
	Enabled bool `yaml:"enabled" json:"enabled"`
	// Labels are node label keys that form cohorts besides the built-in
	// keys: a rack (topology.kubernetes.io/rack), an NVLink domain, a
	// placement group. Nodes with the same value of a label are one cohort.
	Labels []string `yaml:"labels" json:"labels"`
	// Window is the sliding window failing nodes are counted in.
	Window time.Duration `yaml:"window" json:"window"`
	// CoolDown closes an open breaker after this long without a new failure
	// of a member; at least Window. 0 (the default): 15m, or Window when
	// that is longer.
	CoolDown time.Duration `yaml:"coolDown" json:"coolDown"`
	// MinFailing is the fewest failing nodes a cohort trips with (>= 2).
	MinFailing int `yaml:"minFailing" json:"minFailing"`
	// Alpha is the family-wise significance level of one evaluation, in (0, 1).
	Alpha float64 `yaml:"alpha" json:"alpha"`
	// MinRateRatio is the cohort's failure rate over the rest's a trip needs (>= 1).
	MinRateRatio float64 `yaml:"minRateRatio" json:"minRateRatio"`
	// CeilingFraction pauses every repair when this fraction of the fleet
	// fails unexplained, in (0, 1].
	CeilingFraction float64 `yaml:"ceilingFraction" json:"ceilingFraction"`
	// CeilingMinFailing is the ceiling's floor of failing nodes (>= MinFailing).
	CeilingMinFailing int `yaml:"ceilingMinFailing" json:"ceilingMinFailing"`
	// RolloutKeys are the keys whose trip asks to halt the rollout.
	RolloutKeys []string `yaml:"rolloutKeys" json:"rolloutKeys"`
	// Memory is how long a software cohort stays suspect after it cooled
	// down; negative (-1s) disables the memory.
	Memory time.Duration `yaml:"memory" json:"memory"`
	// ReplacementFailures is how many replacements failing the same way
	// trip their NodePool's breaker; negative disables the rule.
	ReplacementFailures int `yaml:"replacementFailures" json:"replacementFailures"`
}

// Budgets are the deletion budgets of every cluster and NodePool
// (decide.Budget). 0 stops every deletion the budget counts.
type Budgets struct {
	// DeletionsPerHour: NodeClaim deletions each cluster may start per
	// sliding hour.
	DeletionsPerHour int `yaml:"deletionsPerHour" json:"deletionsPerHour"`
	// NodePoolDeletionsPerHour: deletions each NodePool may start per
	// sliding hour.
	NodePoolDeletionsPerHour int `yaml:"nodePoolDeletionsPerHour" json:"nodePoolDeletionsPerHour"`
	// MaxInFlightPerNodePool: deletions in progress at once per NodePool
	// (a repair in the deleting state, until its NodeClaim is gone).
	MaxInFlightPerNodePool int `yaml:"maxInFlightPerNodePool" json:"maxInFlightPerNodePool"`
	// MinHealthy is the least number of healthy nodes (Ready, not
	// quarantined) every NodePool keeps: below it no repair of the pool
	// deletes anything. 0: none. A NodePool's minHealthy in the policy
	// overrides it.
	MinHealthy int `yaml:"minHealthy" json:"minHealthy"`
}

// Repair holds the repair ledger's timings and the reconciler's settings.
type Repair struct {
	// DryRun records every decision and deletes no NodeClaim.
	DryRun bool `yaml:"dryRun" json:"dryRun"`
	// Toleration, when > 0, replaces every reason's toleration (demos);
	// 0: the catalog's and the policy's.
	Toleration time.Duration `yaml:"toleration" json:"toleration"`
	// Resync is the period of the pass over open repairs, which evaluates
	// the breakers first.
	Resync time.Duration `yaml:"resync" json:"resync"`
	// Lookback bounds the history of earlier boots read per node.
	Lookback time.Duration `yaml:"lookback" json:"lookback"`
	// ApprovalTTL is how long a repair waits for on-call approval before it
	// expires.
	ApprovalTTL time.Duration `yaml:"approvalTTL" json:"approvalTTL"`
	// MaxBreakerAge is the oldest breaker evaluation the deletion guard
	// acts on; 0: 3 x Resync, at least 30s (MaxBreakerAgeOf).
	MaxBreakerAge time.Duration `yaml:"maxBreakerAge" json:"maxBreakerAge"`
	// DrainPerPass is how many breaker-held repairs one pass releases after
	// their breaker closed.
	DrainPerPass int `yaml:"drainPerPass" json:"drainPerPass"`
	// Workers is the number of nodes reconciled at once (live only).
	Workers int `yaml:"workers" json:"workers"`
}

// The defaults of the repair ledger, in one place: controller/repair,
// controller/shadow and controller/simulate fill a zero field with these.
const (
	DefaultResync       = 10 * time.Second
	DefaultLookback     = 7 * 24 * time.Hour
	DefaultApprovalTTL  = 24 * time.Hour
	DefaultDrainPerPass = 1
	DefaultWorkers      = 16
	// DefaultDeletingFor is how long the replays (controller/shadow,
	// controller/simulate) count a deletion in flight against
	// budgets.maxInFlightPerNodePool: the ledger's deleting state lasts
	// until the NodeClaim is gone (drain and termination), which a replay
	// does not observe. It is a model assumption, not a controller setting.
	DefaultDeletingFor   = 5 * time.Minute
	minMaxBreakerAge     = 30 * time.Second
	maxBreakerAgeRatio   = 3
	defaultDeletionsHour = 10
	defaultPoolHour      = 5
	defaultInFlight      = 1
)

// Default returns the defaults of every setting.
func Default() Config {
	return Config{
		Breaker: Breaker{
			Enabled:             true,
			Window:              breaker.DefaultWindow,
			MinFailing:          breaker.DefaultMinFailing,
			Alpha:               breaker.DefaultAlpha,
			MinRateRatio:        breaker.DefaultMinRateRatio,
			CeilingFraction:     breaker.DefaultCeilingFraction,
			CeilingMinFailing:   breaker.DefaultCeilingMinFailing,
			RolloutKeys:         breaker.DefaultRolloutKeys(),
			Memory:              breaker.DefaultMemory,
			ReplacementFailures: breaker.DefaultReplacementFailures,
		},
		Budgets: Budgets{DeletionsPerHour: defaultDeletionsHour, NodePoolDeletionsPerHour: defaultPoolHour, MaxInFlightPerNodePool: defaultInFlight},
		Repair: Repair{Resync: DefaultResync, Lookback: DefaultLookback, ApprovalTTL: DefaultApprovalTTL,
			DrainPerPass: DefaultDrainPerPass, Workers: DefaultWorkers},
	}
}

// MaxBreakerAgeOf is the MaxBreakerAge a zero setting means for a resync
// period: three passes, at least 30s.
func MaxBreakerAgeOf(resync time.Duration) time.Duration {
	return max(maxBreakerAgeRatio*resync, minMaxBreakerAge)
}

// BreakerAge returns the effective MaxBreakerAge.
func (r Repair) BreakerAge() time.Duration {
	if r.MaxBreakerAge > 0 {
		return r.MaxBreakerAge
	}
	return MaxBreakerAgeOf(r.Resync)
}

// BreakerConfig returns the breaker settings as controller/breaker takes
// them.
func (b Breaker) BreakerConfig() breaker.Config {
	return breaker.Config{Labels: slices.Clone(b.Labels), Window: b.Window, CoolDown: b.CoolDown, MinFailing: b.MinFailing,
		Alpha: b.Alpha, MinRateRatio: b.MinRateRatio, CeilingFraction: b.CeilingFraction, CeilingMinFailing: b.CeilingMinFailing,
		RolloutKeys: slices.Clone(b.RolloutKeys), Memory: b.Memory, ReplacementFailures: b.ReplacementFailures}
}

// BreakerPolicy returns the validated breaker policy, nil when the
// breakers are off.
func (c Config) BreakerPolicy() (*breaker.Policy, error) {
	if !c.Breaker.Enabled {
		return nil, nil
	}
	return breaker.NewPolicy(c.Breaker.BreakerConfig())
}

// Budget returns the budgets as controller/decide checks them, with the
// minimum healthy count of nodePool (the policy's, else
// Budgets.MinHealthy).
func (c Config) Budget(nodePool string) decide.Budget {
	return decide.Budget{DeletionsPerHour: c.Budgets.DeletionsPerHour, MaxInFlightPerNodePool: c.Budgets.MaxInFlightPerNodePool,
		NodePoolDeletionsPerHour: c.Budgets.NodePoolDeletionsPerHour, MinHealthy: c.MinHealthy(nodePool)}
}

// MinHealthy returns nodePool's minimum healthy count: the policy's
// nodePools.<pool>.minHealthy, else Budgets.MinHealthy.
func (c Config) MinHealthy(nodePool string) int {
	return c.ResolvedPolicy().MinHealthy(nodePool)
}

// ResolvedPolicy returns the policy the callers apply: Policy with
// DefaultMinHealthy set from Budgets.MinHealthy, or nil when there are
// neither overrides nor a minimum.
func (c Config) ResolvedPolicy() *policy.Policy {
	if c.Policy == nil && c.Budgets.MinHealthy == 0 {
		return nil
	}
	p := policy.Policy{}
	if c.Policy != nil {
		p = *c.Policy
	}
	p.DefaultMinHealthy = c.Budgets.MinHealthy
	return &p
}

// Load reads and validates a configuration file (Parse), then reads its
// PolicyFile, relative to the file's directory, into Policy. Errors name
// the file and the line.
func Load(path string, c *catalog.Catalog) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	cfg, err := Parse(b, c)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	if cfg.PolicyFile != "" {
		pf := cfg.PolicyFile
		if !filepath.IsAbs(pf) {
			pf = filepath.Join(filepath.Dir(path), pf)
		}
		if cfg.Policy, err = policy.Load(pf, catalogOr(c)); err != nil {
			return Config{}, fmt.Errorf("config %s: policyFile: %w", path, err)
		}
	}
	return cfg, nil
}

func catalogOr(c *catalog.Catalog) *catalog.Catalog {
	if c == nil {
		return catalog.Default()
	}
	return c
}

// Parse decodes configuration YAML on top of Default and validates it;
// the inline policy is checked against the catalog c (nil: the default
// catalog). PolicyFile is not read (Load does). An empty document is the
// defaults.
func Parse(data []byte, c *catalog.Catalog) (Config, error) {
	cfg := Default()
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return Config{}, fmt.Errorf("decode: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("decode: %s", strictError(err))
	}
	if cfg.Policy != nil && cfg.PolicyFile != "" {
		return Config{}, fmt.Errorf("line %d: policy and policyFile: give the policy inline or as a file, not both", policy.LineOf(&root, "policyFile"))
	}
	if err := cfg.Policy.Validate(catalogOr(c), &root, "policy"); err != nil {
		return Config{}, err
	}
	if err := cfg.validate(func(path ...string) int { return policy.LineOf(&root, path...) }); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// strictError rewrites yaml.v3's messages for the Go types into the
// file's words ("field typo not found in type config.Budgets" ->
// "unknown key typo").
func strictError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:\n")
	var out []string
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		if i := strings.Index(l, "field "); i >= 0 && strings.Contains(l, " not found in type ") {
			name := strings.TrimPrefix(l[i:], "field ")
			name = name[:strings.Index(name, " not found in type ")]
			l = l[:i] + "unknown key " + name + " (docs/config.md lists the keys)"
		}
		out = append(out, l)
	}
	return strings.Join(out, "; ")
}

// Validate checks the settings' ranges (what Parse checks after decoding).
// Flags that override a parsed Config are checked with it again.
func (c Config) Validate() error {
	return c.validate(nil)
}

func (c Config) validate(line func(path ...string) int) error {
	at := func(path ...string) string {
		key := strings.Join(path, ".")
		if line == nil {
			return key
		}
		return fmt.Sprintf("line %d: %s", line(path...), key)
	}
	b, bu, r := c.Breaker, c.Budgets, c.Repair
	var errs []error
	check := func(ok bool, msg string, path ...string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s", at(path...), msg))
		}
	}
	check(bu.DeletionsPerHour >= 0, "must be >= 0 (0 stops every deletion)", "budgets", "deletionsPerHour")
	check(bu.NodePoolDeletionsPerHour >= 0, "must be >= 0 (0 stops every deletion)", "budgets", "nodePoolDeletionsPerHour")
	check(bu.MaxInFlightPerNodePool >= 0, "must be >= 0 (0 stops every deletion)", "budgets", "maxInFlightPerNodePool")
	check(bu.MinHealthy >= 0, "must be >= 0 (0: none)", "budgets", "minHealthy")
	check(r.Toleration >= 0, "must be >= 0 (0: the catalog's tolerations)", "repair", "toleration")
	check(r.Resync > 0, "must be > 0", "repair", "resync")
	check(r.Lookback > 0, "must be > 0", "repair", "lookback")
	check(r.ApprovalTTL > 0, "must be > 0", "repair", "approvalTTL")
	check(r.MaxBreakerAge >= 0, "must be >= 0 (0: 3 x resync, at least 30s)", "repair", "maxBreakerAge")
	check(r.DrainPerPass > 0, "must be > 0", "repair", "drainPerPass")
	check(r.Workers > 0, "must be > 0", "repair", "workers")
	for i, l := range b.Labels {
		check(strings.TrimSpace(l) != "" && !strings.ContainsAny(l, " \t="), fmt.Sprintf("labels[%d] %q is not a label key", i, l), "breaker", "labels")
	}
	if b.Enabled {
		if _, err := breaker.NewPolicy(b.BreakerConfig()); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at("breaker"), err))
		}
	}
	return errors.Join(errs...)
}
