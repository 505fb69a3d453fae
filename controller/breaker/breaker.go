// Package breaker decides when repairs must stop because many nodes fail for
// a shared cause (docs/design.md, decision 8). It is pure: it takes node metadata,
// failure signals and an injected time, and returns the new breaker state and
// the decisions (state changes, each with its evidence). The repair layer asks
// Allows before every NodeClaim deletion; the store persists State and audits
// every Decision.
//
// Nodes fall into cohorts by attribute: cluster, nodepool, zone,
// instance_type, image, kernel, driver_version, monitoring_image and any
// configured label (rack, nvlink_domain). A cohort's breaker trips when,
// within a sliding window, its failing nodes (unique nodes with at least one
// fault signal) are both many (Config.MinFailing) and concentrated: the
// one-sided Fisher exact test says the cohort holds more of the fleet's
// failing nodes than chance would put there (p below Config.Alpha, Bonferroni
// corrected for the cohorts tested), and its failure rate is at least
// Config.MinRateRatio times the rest of the fleet's (Jeffreys-smoothed rates).
// docs/breakers.md explains the choice.
//
// When several cohorts trip for the same failing nodes, one breaker opens:
// the strongest evidence (smallest p-value), then the most specific cause by
// key precedence (software versions, then configured labels, then zone,
// instance type, nodepool, cluster); the others are recorded as explained by
// it. Failures inside an open cohort do not count again for other cohorts or
// for the fleet ceiling.
//
// Breakers are sticky: an open breaker stays open until a human resumes it or
// it cools down (Config.CoolDown without a new failure signal from a member).
// A fleet-wide ceiling (too many unexplained failing nodes) and a kill switch
// stop every repair.
package breaker

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Well-known cohort keys (node attributes).
const (
	KeyCluster         = "cluster"
	KeyNodePool        = "nodepool"
	KeyZone            = "zone"
	KeyInstanceType    = "instance_type"
	KeyImage           = "image"            // AMI or node OS image
	KeyKernel          = "kernel"           // kernel release
	KeyDriverVersion   = "driver_version"   // NVIDIA driver version reported by the agent
	KeyMonitoringImage = "monitoring_image" // DCGM / monitoring DaemonSet image
)

// FleetScope is the cohort name Resume takes for the fleet-wide ceiling.
const FleetScope = "fleet"

// softwareKeys rank first: a version that some nodes run and others do not is
// an actionable cause (roll it back), and a rollout changes exactly one of
// them. placementKeys rank last: a nodepool or a cluster is a container that
// rarely causes a fault by itself.
var (
	softwareKeys  = []string{KeyDriverVersion, KeyMonitoringImage, KeyKernel, KeyImage}
	placementKeys = []string{KeyZone, KeyInstanceType, KeyNodePool, KeyCluster}
)

// Defaults for Config fields left zero.
const (
	DefaultWindow            = 10 * time.Minute
	DefaultCoolDown          = 15 * time.Minute
	DefaultMinFailing        = 3
	DefaultAlpha             = 1e-3
	DefaultMinRateRatio      = 4.0
	DefaultCeilingFraction   = 0.10
	DefaultCeilingMinFailing = 10
	DefaultMemory            = 24 * time.Hour
	// DefaultReplacementFailures is Config.ReplacementFailures's default.
	DefaultReplacementFailures = 1
	// DefaultReplacementCycle is how long after it joins a replacement's
	// failure of the same fault class as the repair counts as the
	// replacement failing the same way (Signal.Replacement): the c28
	// replacements failed about half an hour after joining.
	DefaultReplacementCycle = 2 * time.Hour
	maxEvidenceNodes        = 20
)

// Config holds the breaker thresholds. The zero value of a field means its
// default; NewPolicy validates the result.
type Config struct {
	// Labels are extra cohort keys from node labels (rack, nvlink_domain,
	// placement_group). They rank after the software keys and before zone.
	Labels []string `json:"labels,omitempty"`
	// Window is the sliding window over which failing nodes are counted
	// (default 10 min).
	Window time.Duration `json:"window"`
	// MinFailing is the absolute floor: a cohort trips only with at least
	// this many failing nodes in the window (default 3), so a lone failure
	// in a 3-node pool is still repaired. It is also the floor of the ceiling.
	MinFailing int `json:"minFailing"`
	// Alpha is the family-wise significance level of one evaluation
	// (default 1e-3); each cohort is tested at Alpha divided by the number of
	// cohorts tested (Bonferroni).
	Alpha float64 `json:"alpha"`
	// MinRateRatio is the effect size a trip needs besides significance: the
	// cohort's failure rate over the rest of the fleet's, both
	// Jeffreys-smoothed (default 4). Without it a huge fleet makes tiny
	// differences significant.
	MinRateRatio float64 `json:"minRateRatio"`
	// CoolDown closes an open cohort breaker after this long without a new
	// failure signal from one of its members, and the fleet ceiling after
	// this long below its threshold (default 15 min). It must be >= Window,
	// so the failures that opened a breaker have left the window when it
	// closes.
	CoolDown time.Duration `json:"coolDown"`
	// CeilingFraction pauses every repair when the failing nodes no open
	// cohort explains reach this fraction of the fleet (default 0.10) and
	// CeilingMinFailing nodes.
	CeilingFraction float64 `json:"ceilingFraction"`
	// CeilingMinFailing is the ceiling's absolute floor (default 10): in a
	// small fleet a percentage means little (one node of three is 33%),
	// and a few simultaneous failures are each handled on their own or by
	// a cohort breaker.
	CeilingMinFailing int `json:"ceilingMinFailing"`
	// RolloutKeys are keys whose trip also asks to halt the rollout that
	// spreads the value (default: driver_version, monitoring_image, kernel,
	// image).
	RolloutKeys []string `json:"rolloutKeys,omitempty"`
	// Memory is how long a software cohort (a RolloutKeys value: a driver
	// version, an image, a kernel) stays suspect after its breaker cooled
	// down (default 24 h). While the value is still installed on some node,
	// the first new failure of one of them re-trips the breaker at once
	// (CauseRemembered): a bad driver does not become good by being quiet
	// for a cool-down. Negative disables the memory.
	Memory time.Duration `json:"memory"`
	// ReplacementFailures is how many replacement machines failing the
	// same way (Signal.Replacement) within the window trip their NodePool's
	// breaker at once, whatever the pool's size (default 1): a new machine
	// with the old fault means the cause is not the machine (c28), and
	// another replacement round only feeds it new machines. Negative
	// disables the rule.
	ReplacementFailures int `json:"replacementFailures"`
}

// DefaultRolloutKeys returns Config.RolloutKeys's default: the software
// keys (driver_version, monitoring_image, kernel, image).
func DefaultRolloutKeys() []string { return append([]string(nil), softwareKeys...) }

// Keys returns the cohort keys in precedence order: the most specific cause
// first (software versions, configured labels, zone, instance type,
// nodepool, cluster).
func (c Config) Keys() []string {
	var out []string
	seen := map[string]bool{}
	for _, group := range [][]string{softwareKeys, c.Labels, placementKeys} {
		for _, k := range group {
			if k != "" && !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

func (c Config) withDefaults() Config {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.CoolDown == 0 {
		c.CoolDown = max(DefaultCoolDown, c.Window)
	}
	if c.MinFailing == 0 {
		c.MinFailing = DefaultMinFailing
	}
	if c.Alpha == 0 {
		c.Alpha = DefaultAlpha
	}
	if c.MinRateRatio == 0 {
		c.MinRateRatio = DefaultMinRateRatio
	}
	if c.CeilingFraction == 0 {
		c.CeilingFraction = DefaultCeilingFraction
	}
	if c.CeilingMinFailing == 0 {
		c.CeilingMinFailing = DefaultCeilingMinFailing
	}
	if c.RolloutKeys == nil {
		c.RolloutKeys = append([]string(nil), softwareKeys...)
	}
	if c.Memory == 0 {
		c.Memory = DefaultMemory
	}
	if c.ReplacementFailures == 0 {
		c.ReplacementFailures = DefaultReplacementFailures
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Window <= 0:
		return fmt.Errorf("window must be positive, got %s", c.Window)
	case c.CoolDown < c.Window:
		return fmt.Errorf("cool-down %s must be >= window %s", c.CoolDown, c.Window)
	case c.MinFailing < 2:
		return fmt.Errorf("minimum failing nodes must be >= 2, got %d", c.MinFailing)
	case !(c.Alpha > 0 && c.Alpha < 1):
		return fmt.Errorf("alpha must be in (0, 1), got %g", c.Alpha)
	case !(c.MinRateRatio >= 1):
		return fmt.Errorf("minimum rate ratio must be >= 1, got %g", c.MinRateRatio)
	case !(c.CeilingFraction > 0 && c.CeilingFraction <= 1):
		return fmt.Errorf("ceiling fraction must be in (0, 1], got %g", c.CeilingFraction)
	case c.CeilingMinFailing < c.MinFailing:
		return fmt.Errorf("ceiling floor %d must be >= the cohort floor %d", c.CeilingMinFailing, c.MinFailing)
	}
	return nil
}

// Policy evaluates breakers under one validated Config. It holds no state
// and is safe for concurrent use.
type Policy struct{ cfg Config }

// NewPolicy fills defaults into cfg and validates it.
func NewPolicy(cfg Config) (*Policy, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("validate breaker config: %w", err)
	}
	return &Policy{cfg: cfg}, nil
}

// Config returns the effective configuration, defaults filled in.
func (p *Policy) Config() Config { return p.cfg }

// Signal is one fault signal: at At, node Node had a diagnosis whose fault
// class is not "none", of condition or event severity. Events count: an Xid
// 31 on every node of a driver version (case c10), or a monitoring-plane
// event on every node of a DCGM image (c17), is the correlation the breaker
// exists for, even though per node it is only an event.
//
// A new failure (a finding arrived) is a plain signal at its time. A node
// whose condition is still active sends Ongoing signals (At = now at each
// evaluation): they keep an open breaker of its cohorts from cooling down
// while its nodes stay broken (a zone outage lasts longer than a cool-down),
// but count towards no trip and not towards the ceiling, so conditions that
// linger (a repair waiting for approval) do not pile up into a false trip.
//
// The caller drops a node's signals when the node's cohort attributes change
// (a rollout or a rollback): they describe its old configuration.
type Signal struct {
	Node    string    `json:"node"`
	At      time.Time `json:"at"`
	Ongoing bool      `json:"ongoing,omitempty"`
	// Replacement marks a new failure of a machine that replaced a node
	// repaired for the same fault class, within one replacement cycle of
	// joining: the remedy did not help (Config.ReplacementFailures).
	Replacement bool `json:"replacement,omitempty"`
}

// Scope says what a breaker or decision covers.
type Scope string

// Scopes.
const (
	ScopeCohort     Scope = "cohort"      // one cohort
	ScopeFleet      Scope = "fleet"       // the fleet-wide ceiling
	ScopeKillSwitch Scope = "kill-switch" // the global kill switch
)

// Phase is a breaker's position. Closed breakers are not stored in State.
type Phase string

// Phases.
const (
	Closed Phase = "closed" // repairs proceed
	Open   Phase = "open"   // repairs in scope are held for approval
)

// Cause says why a breaker changed phase.
type Cause string

// Causes.
const (
	CauseTripped           Cause = "tripped"            // a cohort's failures are many and concentrated
	CauseCeiling           Cause = "ceiling"            // too many unexplained failing nodes fleet-wide
	CauseCooledDown        Cause = "cooled-down"        // quiet for Config.CoolDown
	CauseResumed           Cause = "resumed"            // a human closed it
	CauseKillSwitch        Cause = "kill-switch"        // a human switched every repair off or on
	CauseRemembered        Cause = "remembered"         // a new failure in a software cohort that tripped before and is still installed
	CauseReplacementFailed Cause = "replacement-failed" // replacements failed the same way as the nodes they replaced
)

// Evidence is the numbers behind a decision. Rates are failing nodes per
// node within the window.
type Evidence struct {
	// At is the evaluation time the numbers were taken at.
	At time.Time `json:"at"`
	// WindowSeconds is the sliding window, in seconds.
	WindowSeconds float64 `json:"windowSeconds"`
	// CohortNodes and CohortFailing count the cohort's nodes and its nodes
	// with a fault signal in the window, not counting nodes already in
	// another open cohort.
	CohortNodes   int `json:"cohortNodes,omitempty"`
	CohortFailing int `json:"cohortFailing,omitempty"`
	// RestNodes and RestFailing count the rest of the fleet the same way.
	RestNodes   int `json:"restNodes,omitempty"`
	RestFailing int `json:"restFailing,omitempty"`
	// CohortRate and RestRate are Jeffreys posterior means,
	// (failing + 1/2) / (nodes + 1).
	CohortRate float64 `json:"cohortRate,omitempty"`
	RestRate   float64 `json:"restRate,omitempty"`
	RateRatio  float64 `json:"rateRatio,omitempty"`
	// PValue is the one-sided Fisher exact test p-value; it underflows to 0
	// for large incidents, Log10P does not.
	PValue float64 `json:"pValue,omitempty"`
	Log10P float64 `json:"log10P,omitempty"`
	// Threshold is the per-test significance level, Alpha / Tested.
	Threshold float64 `json:"threshold,omitempty"`
	// Tested is how many cohorts were tested in this evaluation.
	Tested int `json:"tested,omitempty"`
	// FirstFailure and LastFailure bound the cohort's signals in the window
	// (LastFailure: the newest signal seen, for cool-down decisions).
	FirstFailure time.Time `json:"firstFailure,omitzero"`
	LastFailure  time.Time `json:"lastFailure,omitzero"`
	// Failing names up to 20 failing nodes, sorted.
	Failing []string `json:"failing,omitempty"`
	// Explains lists other cohorts that tripped for the same failing nodes
	// and lost the tie-break to this one.
	Explains []string `json:"explains,omitempty"`
	// FleetNodes, FleetFailing and CeilingNodes describe the ceiling: fleet
	// size, failing nodes no open cohort explains, and the threshold count.
	FleetNodes   int `json:"fleetNodes,omitempty"`
	FleetFailing int `json:"fleetFailing,omitempty"`
	CeilingNodes int `json:"ceilingNodes,omitempty"`
}

// Breaker is one open breaker.
type Breaker struct {
	Scope Scope `json:"scope"`
	// Cohort is "key=value" for a cohort breaker, FleetScope for the ceiling.
	Cohort string `json:"cohort"`
	// Since is when it opened.
	Since time.Time `json:"since"`
	// LastFailure is the newest failure signal of a member (cohort breakers).
	LastFailure time.Time `json:"lastFailure"`
	// BelowSince is when the unexplained failures fell below the ceiling
	// (fleet breaker only); zero while at or above it.
	BelowSince time.Time `json:"belowSince,omitzero"`
	// HaltRollout asks the rollout spreading this value to stop.
	HaltRollout bool `json:"haltRollout,omitempty"`
	// Evidence is the numbers at the trip.
	Evidence Evidence `json:"evidence"`
}

// KillSwitch stops every repair while On.
type KillSwitch struct {
	On     bool      `json:"on"`
	Actor  string    `json:"actor,omitempty"`
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since,omitzero"`
}

// State is the persisted breaker state. The zero value has every breaker
// closed. Evaluate, Resume and SetKillSwitch return a new State and never
// modify the one they are given.
type State struct {
	// Cohorts are the open cohort breakers by "key=value".
	Cohorts map[string]Breaker `json:"cohorts,omitempty"`
	// Ceiling is the open fleet-wide breaker, nil when closed.
	Ceiling    *Breaker   `json:"ceiling,omitempty"`
	KillSwitch KillSwitch `json:"killSwitch"`
	// Resumed holds when a human last resumed a cohort (or FleetScope).
	// Entries expire after one window.
	Resumed map[string]time.Time `json:"resumed,omitempty"`
	// Acknowledged holds the nodes that were failing in a cohort when a
	// human resumed it, with the resume time: their failures were looked at
	// and accepted, and count towards no trip (of that cohort, of one that
	// coincides with it, or of the ceiling) while they keep failing. A node
	// leaves the set once it has no signal in the window; a new failure
	// after that counts again.
	Acknowledged map[string]time.Time `json:"acknowledged,omitempty"`
	// Remembered holds the software cohorts ("driver_version=X") whose
	// breaker cooled down within Config.Memory, with their cool-down time
	// and the trip's evidence. A human's resume forgets a cohort; so does
	// the value leaving the fleet (the suspect is no longer installed).
	Remembered map[string]Remembered `json:"remembered,omitempty"`
	// EvaluatedAt is the time of the last Evaluate.
	EvaluatedAt time.Time `json:"evaluatedAt,omitzero"`
}

// Remembered is a software cohort that tripped and cooled down.
type Remembered struct {
	// Tripped is when its breaker first opened; CooledDown when it closed.
	Tripped    time.Time `json:"tripped"`
	CooledDown time.Time `json:"cooledDown"`
	// Evidence is the numbers at the original trip.
	Evidence Evidence `json:"evidence"`
}

// Open returns the open breaker of a cohort ("key=value", or FleetScope).
func (s State) Open(cohort string) (Breaker, bool) {
	if cohort == FleetScope {
		if s.Ceiling != nil {
			return *s.Ceiling, true
		}
		return Breaker{}, false
	}
	b, ok := s.Cohorts[cohort]
	return b, ok
}

// OpenCohorts returns the open cohort breakers' names, sorted.
func (s State) OpenCohorts() []string {
	out := make([]string, 0, len(s.Cohorts))
	for k := range s.Cohorts {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// gpuSoftwareKeys are the cohort keys of the software a GPU workload runs
// on: the driver, the kernel and the node image (not the monitoring image,
// which cannot make a CUDA context fault).
var gpuSoftwareKeys = map[string]bool{KeyDriverVersion: true, KeyKernel: true, KeyImage: true}

// SoftwareSuspects returns the driver, kernel and image cohorts ("key=value",
// sorted) that node belongs to and whose breaker is open or remembered (it
// tripped, cooled down, and the version is still installed): the fleet's
// verdict that this software, not the node, is failing. The diagnosis
// attributes a node's application-class Xids to it (case c10).
func (s State) SoftwareSuspects(node Node) []string {
	var out []string
	add := func(name string) {
		c, err := ParseCohort(name)
		if err == nil && gpuSoftwareKeys[c.Key] && node.Attrs[c.Key] == c.Value && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for name := range s.Cohorts {
		add(name)
	}
	for name := range s.Remembered {
		add(name)
	}
	sort.Strings(out)
	return out
}

// Tripped reports whether anything holds repairs: an open cohort breaker,
// the ceiling or the kill switch.
func (s State) Tripped() bool { return len(s.Cohorts) > 0 || s.Ceiling != nil || s.KillSwitch.On }

func (s State) clone() State {
	out := s
	out.Cohorts = make(map[string]Breaker, len(s.Cohorts))
	for k, v := range s.Cohorts {
		out.Cohorts[k] = v
	}
	if s.Ceiling != nil {
		c := *s.Ceiling
		out.Ceiling = &c
	}
	out.Resumed = make(map[string]time.Time, len(s.Resumed))
	for k, v := range s.Resumed {
		out.Resumed[k] = v
	}
	out.Acknowledged = make(map[string]time.Time, len(s.Acknowledged))
	for k, v := range s.Acknowledged {
		out.Acknowledged[k] = v
	}
	out.Remembered = make(map[string]Remembered, len(s.Remembered))
	for k, v := range s.Remembered {
		out.Remembered[k] = v
	}
	return out
}

// Decision is one state change, with its evidence, for the audit log.
type Decision struct {
	At     time.Time `json:"at"`
	Scope  Scope     `json:"scope"`
	Cohort string    `json:"cohort,omitempty"`
	From   Phase     `json:"from"`
	To     Phase     `json:"to"`
	Cause  Cause     `json:"cause"`
	// Actor is "breaker" for automatic decisions, else the human's identity.
	Actor       string   `json:"actor"`
	Message     string   `json:"message"`
	HaltRollout bool     `json:"haltRollout,omitempty"`
	Evidence    Evidence `json:"evidence"`
}

// Actor is the audit identity of automatic decisions.
const Actor = "breaker"

// ErrNotOpen is returned by Resume for a breaker that is not open.
var ErrNotOpen = errors.New("breaker is not open")

// nodeSignals is one node's signals as Evaluate sees them.
type nodeSignals struct {
	first, last time.Time // bounds of the new-failure signals within the window
	newest      time.Time // newest signal at or before now (any age, ongoing included)
	inWindow    bool      // a new-failure signal lies within the window
	replacement bool      // a Replacement signal lies within the window
}

// Evaluate returns the breaker state at now given the fleet, the failure
// signals (any order; signals after now are ignored; older ones only feed
// cool-downs) and the prior state, plus the decisions taken, in order:
// cool-downs, trips, ceiling changes.
func (p *Policy) Evaluate(now time.Time, fleet *Fleet, signals []Signal, prior State) (State, []Decision) {
	cfg := p.cfg
	st := prior.clone()
	var ds []Decision
	from := now.Add(-cfg.Window)

	sig := make(map[int32]*nodeSignals, len(signals))
	for _, s := range signals {
		i, ok := fleet.pos[s.Node]
		if !ok || s.At.After(now) {
			continue
		}
		ns := sig[i]
		if ns == nil {
			ns = &nodeSignals{}
			sig[i] = ns
		}
		if s.At.After(ns.newest) {
			ns.newest = s.At
		}
		if !s.Ongoing && s.At.After(from) {
			if !ns.inWindow || s.At.Before(ns.first) {
				ns.first = s.At
			}
			if !ns.inWindow || s.At.After(ns.last) {
				ns.last = s.At
			}
			ns.inWindow = true
			ns.replacement = ns.replacement || s.Replacement
		}
	}

	// Acknowledgements: nodes failing in a resumed cohort at the resume join
	// the set; nodes without a signal in the window leave it.
	for name := range st.Acknowledged {
		if i, ok := fleet.pos[name]; !ok || sig[i] == nil || !sig[i].inWindow {
			delete(st.Acknowledged, name)
		}
	}
	if len(st.Resumed) > 0 {
		resumed := resumedIDs(fleet, st.Resumed)
		fleetResumed, fleetWasResumed := st.Resumed[FleetScope]
		for i, ns := range sig {
			if !ns.inWindow {
				continue
			}
			at, ack := fleetResumed, fleetWasResumed && !ns.first.After(fleetResumed)
			for _, c := range fleet.nodeCohorts(i) {
				if t, ok := resumed[c]; ok && c >= 0 && !ns.first.After(t) {
					at, ack = t, true
				}
			}
			if ack {
				if _, already := st.Acknowledged[fleet.names[i]]; !already {
					st.Acknowledged[fleet.names[i]] = at
				}
			}
		}
	}

	// Open cohort breakers: newest member signal, then cool-downs.
	open := openIDs(fleet, st.Cohorts)
	for i, ns := range sig {
		for _, c := range fleet.nodeCohorts(i) {
			if c < 0 {
				continue
			}
			if name, ok := open[c]; ok {
				if b := st.Cohorts[name]; ns.newest.After(b.LastFailure) {
					b.LastFailure = ns.newest
					st.Cohorts[name] = b
				}
			}
		}
	}
	for _, name := range st.OpenCohorts() {
		b := st.Cohorts[name]
		if now.Sub(b.LastFailure) < cfg.CoolDown {
			continue
		}
		delete(st.Cohorts, name)
		if c, err := ParseCohort(name); err == nil && cfg.Memory > 0 && slices.Contains(cfg.RolloutKeys, c.Key) {
			st.Remembered[name] = Remembered{Tripped: b.Since, CooledDown: now, Evidence: b.Evidence}
		}
		ev := Evidence{At: now, WindowSeconds: cfg.Window.Seconds(), LastFailure: b.LastFailure}
		if c, err := ParseCohort(name); err == nil {
			ev.CohortNodes = fleet.CohortSize(c)
		}
		ds = append(ds, Decision{At: now, Scope: ScopeCohort, Cohort: name, From: Open, To: Closed,
			Cause: CauseCooledDown, Actor: Actor, HaltRollout: b.HaltRollout, Evidence: ev,
			Message: fmt.Sprintf("breaker %s closed: no new failure signal from its nodes since %s (cool-down %s)",
				name, b.LastFailure.Format(time.RFC3339), cfg.CoolDown)})
	}

	ds = append(ds, p.remembered(now, fleet, sig, &st)...)
	ds = append(ds, p.replacements(now, fleet, sig, &st)...)

	// Trips: greedy, one cohort per round, each round on the population no
	// open cohort explains.
	var unexplained int
	var prevPassing []int32
	var picked *Breaker
	for {
		r := p.round(now, fleet, sig, st)
		unexplained = r.unexplainedFailing
		if picked != nil {
			for _, c := range prevPassing {
				if name := fleet.cohorts[c].String(); name != picked.Cohort && !slices.Contains(r.passing, c) {
					picked.Evidence.Explains = append(picked.Evidence.Explains, name)
				}
			}
			st.Cohorts[picked.Cohort] = *picked
			ds[len(ds)-1].Evidence = picked.Evidence
		}
		if len(r.passing) == 0 {
			break
		}
		best := r.passing[0]
		ev := r.evidence[best]
		name := fleet.cohorts[best].String()
		halt := slices.Contains(cfg.RolloutKeys, fleet.cohorts[best].Key)
		picked = &Breaker{Scope: ScopeCohort, Cohort: name, Since: now, LastFailure: ev.LastFailure,
			HaltRollout: halt, Evidence: ev}
		st.Cohorts[name] = *picked
		ds = append(ds, Decision{At: now, Scope: ScopeCohort, Cohort: name, From: Closed, To: Open,
			Cause: CauseTripped, Actor: Actor, HaltRollout: halt, Evidence: ev,
			Message: fmt.Sprintf("breaker %s tripped: %d of %d nodes failing within %s (rest of fleet %d of %d), rate ratio %.3g, p=10^%.1f < %.2g",
				name, ev.CohortFailing, ev.CohortNodes, cfg.Window, ev.RestFailing, ev.RestNodes, ev.RateRatio, ev.Log10P, ev.Threshold)})
		prevPassing = r.passing
	}

	// Fleet-wide ceiling on the failures no open cohort explains.
	n := fleet.Len()
	limit := max(cfg.CeilingMinFailing, int(math.Ceil(cfg.CeilingFraction*float64(n))))
	ev := Evidence{At: now, WindowSeconds: cfg.Window.Seconds(), FleetNodes: n, FleetFailing: unexplained, CeilingNodes: limit}
	switch {
	case st.Ceiling == nil && ev.FleetFailing >= limit:
		st.Ceiling = &Breaker{Scope: ScopeFleet, Cohort: FleetScope, Since: now, Evidence: ev}
		ds = append(ds, Decision{At: now, Scope: ScopeFleet, Cohort: FleetScope, From: Closed, To: Open,
			Cause: CauseCeiling, Actor: Actor, Evidence: ev,
			Message: fmt.Sprintf("fleet ceiling tripped: %d of %d nodes failing within %s that no cohort explains (ceiling %d)",
				ev.FleetFailing, n, cfg.Window, limit)})
	case st.Ceiling != nil && ev.FleetFailing >= limit:
		st.Ceiling.BelowSince = time.Time{}
	case st.Ceiling != nil && st.Ceiling.BelowSince.IsZero():
		st.Ceiling.BelowSince = now
		fallthrough
	case st.Ceiling != nil:
		if now.Sub(st.Ceiling.BelowSince) >= cfg.CoolDown {
			ds = append(ds, Decision{At: now, Scope: ScopeFleet, Cohort: FleetScope, From: Open, To: Closed,
				Cause: CauseCooledDown, Actor: Actor, Evidence: ev,
				Message: fmt.Sprintf("fleet ceiling closed: below %d failing nodes since %s (cool-down %s)",
					limit, st.Ceiling.BelowSince.Format(time.RFC3339), cfg.CoolDown)})
			st.Ceiling = nil
		}
	}

	for k, t := range st.Resumed {
		if now.Sub(t) >= cfg.Window {
			delete(st.Resumed, k)
		}
	}
	st.EvaluatedAt = now
	return st, ds
}

// remembered re-trips, at once, a remembered software cohort that is still
// installed when one of its nodes fails anew after the cool-down, and
// forgets cohorts past Config.Memory or no longer in the fleet.
func (p *Policy) remembered(now time.Time, fleet *Fleet, sig map[int32]*nodeSignals, st *State) []Decision {
	cfg := p.cfg
	var ds []Decision
	names := make([]string, 0, len(st.Remembered))
	for name := range st.Remembered {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		m := st.Remembered[name]
		c, err := ParseCohort(name)
		if err != nil || cfg.Memory <= 0 || now.Sub(m.CooledDown) >= cfg.Memory || fleet.CohortSize(c) == 0 {
			delete(st.Remembered, name) // forgotten, or the suspect is no longer installed
			continue
		}
		if _, open := st.Cohorts[name]; open {
			continue
		}
		id, _ := fleet.id(c)
		var failing []string
		var first, last time.Time
		for _, i := range fleet.members(id) {
			ns := sig[i]
			if ns == nil || !ns.inWindow || !ns.last.After(m.CooledDown) {
				continue
			}
			if _, ack := st.Acknowledged[fleet.names[i]]; ack {
				continue
			}
			failing = append(failing, fleet.names[i])
			if first.IsZero() || ns.first.Before(first) {
				first = ns.first
			}
			if ns.last.After(last) {
				last = ns.last
			}
		}
		if len(failing) == 0 {
			continue
		}
		slices.Sort(failing)
		ev := m.Evidence
		ev.At, ev.WindowSeconds, ev.CohortNodes, ev.CohortFailing = now, cfg.Window.Seconds(), fleet.CohortSize(c), len(failing)
		ev.FirstFailure, ev.LastFailure, ev.Failing = first, last, failing[:min(len(failing), maxEvidenceNodes)]
		halt := slices.Contains(cfg.RolloutKeys, c.Key)
		st.Cohorts[name] = Breaker{Scope: ScopeCohort, Cohort: name, Since: now, LastFailure: last, HaltRollout: halt, Evidence: ev}
		delete(st.Remembered, name)
		ds = append(ds, Decision{At: now, Scope: ScopeCohort, Cohort: name, From: Closed, To: Open,
			Cause: CauseRemembered, Actor: Actor, HaltRollout: halt, Evidence: ev,
			Message: fmt.Sprintf("breaker %s re-tripped: %s failed after the breaker cooled down at %s while %s is still installed on %d nodes (memory %s)",
				name, failing[0], m.CooledDown.Format(time.RFC3339), name, ev.CohortNodes, cfg.Memory)})
	}
	return ds
}

// replacements trips the NodePool breaker of replacement machines that
// failed the same way as the nodes they replaced, when there are at least
// Config.ReplacementFailures of them in the window and no open breaker of
// theirs explains them already.
func (p *Policy) replacements(now time.Time, fleet *Fleet, sig map[int32]*nodeSignals, st *State) []Decision {
	cfg := p.cfg
	if cfg.ReplacementFailures < 1 {
		return nil
	}
	open := openIDs(fleet, st.Cohorts)
	failing := map[string][]string{} // pool cohort -> failing replacements
	var last = map[string]time.Time{}
	for i, ns := range sig {
		if !ns.inWindow || !ns.replacement {
			continue
		}
		if _, ack := st.Acknowledged[fleet.names[i]]; ack {
			continue
		}
		explained := false
		var pool string
		for _, c := range fleet.nodeCohorts(i) {
			if c < 0 {
				continue
			}
			if _, ok := open[c]; ok {
				explained = true
			}
			if k := fleet.cohorts[c].Key; k == KeyNodePool || pool == "" && k == KeyCluster {
				pool = fleet.cohorts[c].String()
			}
		}
		if explained || pool == "" {
			continue
		}
		failing[pool] = append(failing[pool], fleet.names[i])
		if ns.last.After(last[pool]) {
			last[pool] = ns.last
		}
	}
	pools := make([]string, 0, len(failing))
	for pool := range failing {
		pools = append(pools, pool)
	}
	slices.Sort(pools)
	var ds []Decision
	for _, pool := range pools {
		nodes := failing[pool]
		if len(nodes) < cfg.ReplacementFailures {
			continue
		}
		slices.Sort(nodes)
		c, _ := ParseCohort(pool)
		ev := Evidence{At: now, WindowSeconds: cfg.Window.Seconds(), CohortNodes: fleet.CohortSize(c), CohortFailing: len(nodes),
			LastFailure: last[pool], Failing: nodes[:min(len(nodes), maxEvidenceNodes)]}
		st.Cohorts[pool] = Breaker{Scope: ScopeCohort, Cohort: pool, Since: now, LastFailure: last[pool], Evidence: ev}
		ds = append(ds, Decision{At: now, Scope: ScopeCohort, Cohort: pool, From: Closed, To: Open,
			Cause: CauseReplacementFailed, Actor: Actor, Evidence: ev,
			Message: fmt.Sprintf("breaker %s tripped: %d replacement node(s) failed the same way as the nodes they replaced, or never launched (%s): the cause is not the machines",
				pool, len(nodes), strings.Join(ev.Failing, ", "))})
	}
	return ds
}

// round is one greedy round of Evaluate.
type round struct {
	passing  []int32 // cohorts that trip, best explanation first
	evidence map[int32]Evidence
	// unexplainedFailing counts failing nodes that no open cohort explains
	// and no human acknowledged: the ceiling's measure.
	unexplainedFailing int
}

// round tests every cohort touched by a failing node against the population
// that no open cohort explains.
func (p *Policy) round(now time.Time, fleet *Fleet, sig map[int32]*nodeSignals, st State) round {
	cfg := p.cfg
	// Nodes explained by an open cohort leave the population, and with them
	// their contribution to every cohort they belong to.
	// Slices, not maps: a zone of 30,000 nodes is 240,000 updates.
	var explained bitset
	var removed []int32
	nExplained := 0
	for id := range openIDs(fleet, st.Cohorts) {
		if explained == nil {
			explained = make(bitset, (fleet.Len()+63)/64)
			removed = make([]int32, len(fleet.cohorts))
		}
		for _, i := range fleet.members(id) {
			if explained.has(i) {
				continue
			}
			explained.set(i)
			nExplained++
			for _, m := range fleet.nodeCohorts(i) {
				if m >= 0 {
					removed[m]++
				}
			}
		}
	}
	population := fleet.Len() - nExplained

	type agg struct {
		failing     int
		first, last time.Time
		names       []string
	}
	per := map[int32]*agg{}
	failingTotal := 0
	for i, ns := range sig {
		if _, ack := st.Acknowledged[fleet.names[i]]; !ns.inWindow || explained.has(i) || ack {
			continue
		}
		failingTotal++
		for _, c := range fleet.nodeCohorts(i) {
			if c < 0 {
				continue
			}
			a := per[c]
			if a == nil {
				a = &agg{first: ns.first, last: ns.last}
				per[c] = a
			}
			a.failing++
			if ns.first.Before(a.first) {
				a.first = ns.first
			}
			if ns.last.After(a.last) {
				a.last = ns.last
			}
			if len(a.names) < 4*maxEvidenceNodes {
				a.names = append(a.names, fleet.names[i])
			}
		}
	}
	r := round{evidence: map[int32]Evidence{}, unexplainedFailing: failingTotal}

	type cand struct {
		id  int32
		ev  Evidence
		ok  bool
		lp  float64
		sz  int
		rnk int
	}
	var cands []cand
	for c, a := range per {
		if a.failing < cfg.MinFailing {
			continue
		}
		members := int(fleet.size[c])
		if removed != nil {
			members -= int(removed[c])
		}
		restN, restF := population-members, failingTotal-a.failing
		if restN <= 0 || members <= 0 {
			continue // the cohort is the whole population: nothing to compare with
		}
		if float64(a.failing)/float64(members) <= float64(restF)/float64(restN) {
			continue // not concentrated
		}
		cr, rr := jeffreysRate(a.failing, members), jeffreysRate(restF, restN)
		lp := log10FisherUpper(members, a.failing, population, failingTotal)
		sort.Strings(a.names)
		names := a.names[:min(len(a.names), maxEvidenceNodes)]
		cands = append(cands, cand{id: c, lp: lp, sz: members, rnk: fleet.rank[c], ev: Evidence{
			At: now, WindowSeconds: cfg.Window.Seconds(),
			CohortNodes: members, CohortFailing: a.failing, RestNodes: restN, RestFailing: restF,
			CohortRate: cr, RestRate: rr, RateRatio: cr / rr, PValue: math.Pow(10, lp), Log10P: lp,
			FirstFailure: a.first, LastFailure: a.last, Failing: append([]string(nil), names...),
		}})
	}
	if len(cands) == 0 {
		return r
	}
	threshold := cfg.Alpha / float64(len(cands))
	lt := math.Log10(threshold)
	for i := range cands {
		c := &cands[i]
		c.ev.Threshold, c.ev.Tested = threshold, len(cands)
		c.ok = c.lp <= lt && c.ev.RateRatio >= cfg.MinRateRatio
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if d := a.lp - b.lp; math.Abs(d) > 1e-9*max(1, math.Abs(a.lp)) {
			return d < 0 // stronger evidence first
		}
		if a.rnk != b.rnk {
			return a.rnk < b.rnk // more specific cause first
		}
		if a.sz != b.sz {
			return a.sz < b.sz
		}
		return fleet.cohorts[a.id].String() < fleet.cohorts[b.id].String()
	})
	for _, c := range cands {
		if c.ok {
			r.passing = append(r.passing, c.id)
			r.evidence[c.id] = c.ev
		}
	}
	return r
}

// bitset is a set of node positions; nil is the empty set.
type bitset []uint64

func (b bitset) has(i int32) bool { return b != nil && b[i>>6]&(1<<(uint(i)&63)) != 0 }
func (b bitset) set(i int32)      { b[i>>6] |= 1 << (uint(i) & 63) }

// openIDs maps the fleet's cohort ids of open breakers to their names.
// Open cohorts without members in this fleet are left out.
func openIDs(fleet *Fleet, open map[string]Breaker) map[int32]string {
	out := make(map[int32]string, len(open))
	for name := range open {
		if c, err := ParseCohort(name); err == nil {
			if id, ok := fleet.id(c); ok {
				out[id] = name
			}
		}
	}
	return out
}

// resumedIDs maps the fleet's cohort ids of resumed cohorts to the resume time.
func resumedIDs(fleet *Fleet, resumed map[string]time.Time) map[int32]time.Time {
	out := make(map[int32]time.Time, len(resumed))
	for name, t := range resumed {
		if c, err := ParseCohort(name); err == nil {
			if id, ok := fleet.id(c); ok {
				out[id] = t
			}
		}
	}
	return out
}

// Allows reports whether a repair of node may proceed under st: the kill
// switch is off, the fleet ceiling is closed and none of the node's cohorts
// has an open breaker. When it may not, reason names what holds it, since
// when and on which numbers, for the repair's audit entry and the
// NodeRepairBlocked-style event.
func Allows(st State, node Node) (ok bool, reason string) {
	if st.KillSwitch.On {
		return false, fmt.Sprintf("kill switch on since %s by %s: %s",
			st.KillSwitch.Since.Format(time.RFC3339), st.KillSwitch.Actor, st.KillSwitch.Reason)
	}
	if c := st.Ceiling; c != nil {
		return false, fmt.Sprintf("fleet ceiling open since %s: %d of %d nodes failing that no cohort explains (ceiling %d)",
			c.Since.Format(time.RFC3339), c.Evidence.FleetFailing, c.Evidence.FleetNodes, c.Evidence.CeilingNodes)
	}
	holder := ""
	for name, b := range st.Cohorts {
		c, err := ParseCohort(name)
		if err != nil || node.Attrs[c.Key] != c.Value {
			continue
		}
		if holder == "" || name < holder {
			holder = name
			ev := b.Evidence
			reason = fmt.Sprintf("breaker %s open since %s: %d of %d nodes failing (rest of fleet %d of %d), p=10^%.1f",
				name, b.Since.Format(time.RFC3339), ev.CohortFailing, ev.CohortNodes, ev.RestFailing, ev.RestNodes, ev.Log10P)
		}
	}
	if holder != "" {
		return false, reason
	}
	return true, ""
}

// Resume closes an open breaker on a human's authority: cohort is
// "key=value" or FleetScope. The nodes failing in it now are acknowledged
// at the next Evaluate (State.Acknowledged): they count towards no trip while
// they keep failing, so their repairs proceed; new failures count. actor and
// reason are required for the audit.
func Resume(st State, cohort, actor, reason string, now time.Time) (State, Decision, error) {
	if actor == "" || reason == "" {
		return st, Decision{}, fmt.Errorf("resume breaker %s: actor and reason are required", cohort)
	}
	b, ok := st.Open(cohort)
	if !ok {
		return st, Decision{}, fmt.Errorf("resume breaker %s: %w", cohort, ErrNotOpen)
	}
	out := st.clone()
	if cohort == FleetScope {
		out.Ceiling = nil
	} else {
		delete(out.Cohorts, cohort)
	}
	out.Resumed[cohort] = now
	delete(out.Remembered, cohort) // a human looked at it and accepted it
	ev := b.Evidence
	ev.At = now
	return out, Decision{At: now, Scope: b.Scope, Cohort: cohort, From: Open, To: Closed, Cause: CauseResumed,
		Actor: actor, HaltRollout: b.HaltRollout, Evidence: ev,
		Message: fmt.Sprintf("breaker %s resumed by %s: %s", cohort, actor, reason)}, nil
}

// ResumeOf finds the human resume that released node's hold: among
// decisions (any order), the newest with Cause CauseResumed at or after
// heldAt (when the node's repair was held) whose cohort the node belongs to,
// or the fleet ceiling's. ok is false when no human resumed one: the hold
// ended because the breaker cooled down. The reconciler names the resume in
// each released repair's audit (controller/decide.Facts.Resumed).
func ResumeOf(decisions []Decision, node Node, heldAt time.Time) (d Decision, ok bool) {
	for _, x := range decisions {
		if x.Cause != CauseResumed || x.At.Before(heldAt) || ok && !x.At.After(d.At) {
			continue
		}
		if x.Cohort != FleetScope {
			c, err := ParseCohort(x.Cohort)
			if err != nil || node.Attrs[c.Key] != c.Value {
				continue
			}
		}
		d, ok = x, true
	}
	return d, ok
}

// SetKillSwitch turns the global kill switch on (every repair held) or off.
// Setting it to its current position returns st unchanged and a Decision
// with From == To.
func SetKillSwitch(st State, on bool, actor, reason string, now time.Time) (State, Decision) {
	phase := func(b bool) Phase {
		if b {
			return Open
		}
		return Closed
	}
	out := st.clone()
	d := Decision{At: now, Scope: ScopeKillSwitch, From: phase(st.KillSwitch.On), To: phase(on),
		Cause: CauseKillSwitch, Actor: actor, Evidence: Evidence{At: now}}
	if on {
		out.KillSwitch = KillSwitch{On: true, Actor: actor, Reason: reason, Since: now}
		d.Message = fmt.Sprintf("kill switch on by %s: %s", actor, reason)
	} else {
		out.KillSwitch = KillSwitch{}
		d.Message = fmt.Sprintf("kill switch off by %s: %s", actor, reason)
	}
	if st.KillSwitch.On == on {
		return st, d
	}
	return out, d
}
