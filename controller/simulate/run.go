// Package simulate replays a fleet scenario (docs/simulator.md) on a
// simulated clock through fleetrepair's real policy code — the diagnosis
// rules (controller/diagnose) and the cohort breakers (controller/breaker) —
// plus an in-memory model of the repair ledger's policy, and through two
// baselines implemented here: Karpenter's NodeRepair rule (repair after the
// toleration unless more than 20% of the NodePool is unhealthy) and
// NVSentinel's (pause when more than 50% of the GPU nodes became unhealthy
// within 5 minutes). It reports trips, deletions, paused repairs and, per
// policy, the healthy-cause nodes deleted, the broken nodes left unrepaired
// and the time to repair lone failures; and it evaluates the scenario's
// checkpoints against fleetrepair's run.
//
// It is pure apart from reading files (LoadFile): no wall clock, no
// goroutines, deterministic for a given scenario and seed.
package simulate

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/policy"
)

// Policy names.
const (
	PolicyFleetRepair = "fleetrepair"
	PolicyKarpenter   = "karpenter"
	PolicyNVSentinel  = "nvsentinel"
)

// Baseline thresholds, as the tools document them.
const (
	karpenterUnhealthyFraction  = 0.20            // NodeRepair: no repair when > 20% of the NodePool is unhealthy
	nvsentinelUnhealthyFraction = 0.50            // fault-quarantine breaker: > 50% of GPU nodes ...
	nvsentinelWindow            = 5 * time.Minute // ... became unhealthy within 5 minutes
	vendorToleration            = 10 * time.Minute
	incidentGap                 = 30 * time.Minute // separates incidents on one GPU (checkpoint incidents_on_gpu)
)

// Options configures Run.
type Options struct {
	// Engine is the diagnosis engine; nil means the default catalog.
	Engine *diagnose.Engine
	// Policies to replay; nil means all three, fleetrepair first.
	// Checkpoints are evaluated on fleetrepair's run only.
	Policies []string
	// Context, when set, stops the replay early (Ctrl-C): Run then returns
	// its error.
	Context context.Context
	// Config is the controller configuration fleetrepair's run uses, the
	// one the live controller and the shadow report receive
	// (controller/config; nil: config.Default()): breakers and label
	// cohorts, the deletion budgets (cluster and NodePool, in flight, the
	// minimum healthy count), the repair timings and the policy overrides.
	// A scenario's own parameters override it (Scenario.Settings).
	Config *config.Config
}

// Run replays the scenario under each policy and evaluates its
// checkpoints and expected outcome against fleetrepair's run.
func Run(sc *Scenario, opts Options) (*Result, error) {
	policies := opts.Policies
	if policies == nil {
		policies = []string{PolicyFleetRepair, PolicyKarpenter, PolicyNVSentinel}
	}
	occ, err := expand(sc)
	if err != nil {
		return nil, fmt.Errorf("run scenario %s: %w", sc.Name, err)
	}
	base := config.Default()
	if opts.Config != nil {
		base = *opts.Config
	}
	cfg := sc.Settings(base)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("run scenario %s: %w", sc.Name, err)
	}
	eng := opts.Engine
	if eng == nil {
		// The configuration's per-instance-type expectations, as the live
		// controller's engine has them (cmd/runner).
		if eng, err = diagnose.New(diagnose.Options{InstanceTypes: cfg.ResolvedPolicy().InstanceTypeOverrides()}); err != nil {
			return nil, fmt.Errorf("run scenario %s: %w", sc.Name, err)
		}
	}
	res := &Result{Scenario: sc.Name, Pass: true}
	for _, p := range policies {
		r, err := newReplay(sc, p, eng, occ, cfg)
		if err != nil {
			return nil, fmt.Errorf("run scenario %s: %w", sc.Name, err)
		}
		r.ctx = opts.Context
		r.run()
		if r.ctx != nil && r.ctx.Err() != nil {
			return nil, fmt.Errorf("run scenario %s: %w", sc.Name, r.ctx.Err())
		}
		res.Nodes = len(r.nodes)
		res.Duration = fmtOffset(r.end)
		res.Policies = append(res.Policies, r.out)
		if p == PolicyFleetRepair {
			res.Checkpoints = r.checks
			res.Halted = r.halted
			res.Expectations = expectations(sc, r)
		}
	}
	for _, c := range append(append([]Check(nil), res.Checkpoints...), res.Expectations...) {
		switch c.Status {
		case StatusFail:
			res.Pass = false
		case StatusUnevaluated:
			res.Unevaluated = append(res.Unevaluated, c)
			res.Pass = false
		}
	}
	return res, nil
}

// occurrence is one step at one time.
type occurrence struct {
	at    time.Duration
	step  *Step
	n     int      // occurrence number of the step
	nodes []string // background failures: the node picked
}

// expand lists every step occurrence (ranges repeated, background failures
// drawn) in time order; steps at the same time keep file order.
func expand(sc *Scenario) ([]occurrence, error) {
	var occ []occurrence
	for i := range sc.Timeline {
		s := &sc.Timeline[i]
		for n, t := range s.Times() {
			occ = append(occ, occurrence{at: t, step: s, n: n})
		}
	}
	end := sc.Parameters.End
	for _, o := range occ {
		end = max(end, o.at)
	}
	if len(sc.Background) > 0 {
		nodes := buildNodes(sc)
		for bi, b := range sc.Background {
			var pool []string
			for _, n := range nodes {
				if b.Select.matches(n.name, n.attrs) {
					pool = append(pool, n.name)
				}
			}
			if len(pool) == 0 {
				return nil, fmt.Errorf("background[%d] (%s): the select matches no node", bi, b.Name)
			}
			until := b.Until
			if until < 0 {
				until = end
			}
			step := &Step{Index: len(sc.Timeline) + bi, Kind: KindInject, Findings: b.Findings, Truth: b.Truth}
			rng := rand.New(rand.NewPCG(sc.Seed, uint64(1000+bi)))
			perSecond := b.PerNodePerDay * float64(len(pool)) / 86400
			for t := b.From.Seconds(); ; {
				t += rng.ExpFloat64() / perSecond
				at := time.Duration(t) * time.Second
				if at > until {
					break
				}
				occ = append(occ, occurrence{at: at, step: step, nodes: []string{pool[rng.IntN(len(pool))]}})
			}
		}
	}
	sort.SliceStable(occ, func(i, j int) bool { return occ[i].at < occ[j].at })
	return occ, nil
}

// simNode is one node slot. A replaced node keeps its slot (name and
// attributes); its machine generation changes and its findings start over.
type simNode struct {
	name   string
	attrs  map[string]string
	joinAt time.Duration
	joined bool
	gen    int // machine generation: replacements
	epoch  int // boot within the machine: reboots and GPU resets

	findings   []finding.Finding
	repeats    map[string][2]int // finding content -> index of its first and latest occurrence (-1: none yet)
	injected   []injection       // every injected finding, for checkpoints
	deletingAt time.Time         // NodeClaim deleted, replacement not ready yet; zero otherwise
	// changedAt is when the node's cohort attributes last changed.
	changedAt time.Time
	// rp is fleetrepair's open repair of the node (nil: none).
	rp        *simRepair
	diags     []diagnose.Diagnosis
	head      diagnose.Diagnosis
	vendorBad bool
	dirty     bool

	// Repair model.
	condSince   time.Time       // toleration clock (fleetrepair) / unhealthy since (baselines)
	state       string          // "", tolerating, awaiting_approval, held, budget
	held        bool            // a Pause is open for the node
	heldIdx     int             // index of that Pause in PolicyResult.Paused
	everHeld    bool            // held at least once since the condition began
	history     map[string]bool // "key=value" the node held before (rollback detection)
	deletions   int
	monitorDown bool
	// replacedAt is when this slot's replacement machine joined (zero for
	// the original machine): breaker.ReplacementFailure's joined.
	replacedAt time.Time

	// Ground truth since the last recovery or replacement.
	truth map[Truth]time.Time
	// brokenSince is the machine's first hardware fault. A remedy of the
	// timeline does not reset it (the fault may return, as in c07); a
	// replacement does.
	brokenSince time.Time
}

func (n *simNode) bootID() string { return fmt.Sprintf("g%d-b%d", n.gen, n.epoch) }

// injection is one injected finding as the scenario gave it.
type injection struct {
	at  time.Time
	gpu string
}

// simRepair is fleetrepair's open repair of a node, as the ledger holds it
// (decide.Repair).
type simRepair struct {
	state      ledger.State
	tolUntil   time.Time
	heldBy     string
	releasedBy string
	since      time.Time // when it entered state (the approval expiry clock)
	waitingOn  string    // the owners' hold on the deletion (decide.HoldDoNotDisrupt, HoldOptOut), "" none
}

// Repair model states.
const (
	stateTolerating = "tolerating"
	stateApproval   = "awaiting_approval" // recommended action not executable: on-call decides
	stateHeld       = "held"              // held by a breaker (fleetrepair) or a baseline's rule
	stateBudget     = "budget"            // held by the deletions-per-hour budget
	stateOwners     = "owners"            // held by the node's owners (do-not-disrupt, opt-out)
	stateDeleting   = "deleting"          // NodeClaim deleted, replacement not ready yet
)

type replay struct {
	ctx    context.Context // nil: runs to the end
	sc     *Scenario
	policy string
	eng    *diagnose.Engine
	occ    []occurrence
	end    time.Duration
	t0     time.Time

	nodes  []*simNode
	byName map[string]*simNode
	seq    uint64

	// cfg is the controller configuration of the run (Scenario.Settings);
	// pol its policy, for fleetrepair's run only (nil: none).
	cfg         config.Config
	pol         *policy.Policy
	bp          *breaker.Policy
	fleet       *breaker.Fleet
	fleetDirty  bool
	cohortKeys  map[string]bool
	bstate      breaker.State
	signals     []breaker.Signal
	replaced    []breaker.Replaced // NodeClaim deletions, for breaker.ReplacementFailure
	deletedAt   []time.Time
	poolDeleted map[string][]time.Time // NodePool -> its deletions, for the per-NodePool hourly budget
	nvTripped   bool

	lastRevert time.Duration
	reverted   bool
	xidsAfter  map[int][]time.Duration // Xid -> injection offsets (for new_xidN_since_rollback)

	checks []Check
	halted []Halted
	out    PolicyResult
	ttrs   []time.Duration
}

func buildNodes(sc *Scenario) []*simNode {
	var out []*simNode
	for _, p := range sc.Fleet.NodePools {
		n := 0
		for _, z := range sortedKeys(p.Zones) {
			group := map[string]int{}
			for k := 0; k < p.Zones[z]; k++ {
				n++
				a := map[string]string{breaker.KeyCluster: sc.Fleet.Cluster, breaker.KeyNodePool: p.Name, breaker.KeyZone: z}
				for k, v := range p.Attrs {
					a[k] = v
				}
				for g, size := range p.Groups {
					a[g] = fmt.Sprintf("%s-%s-%d", p.Name, z, group[g]/size+1)
					group[g]++
				}
				out = append(out, &simNode{name: fmt.Sprintf("%s%d", p.Prefix, n), attrs: a, joinAt: p.JoinsAt,
					truth: map[Truth]time.Time{}, history: map[string]bool{}, repeats: map[string][2]int{}})
			}
		}
	}
	return out
}

func newReplay(sc *Scenario, policy string, eng *diagnose.Engine, occ []occurrence, cfg config.Config) (*replay, error) {
	switch policy {
	case PolicyFleetRepair, PolicyKarpenter, PolicyNVSentinel:
	default:
		return nil, fmt.Errorf("policy %q is not one of fleetrepair, karpenter, nvsentinel", policy)
	}
	r := &replay{sc: sc, policy: policy, eng: eng, occ: occ, t0: sc.T0, byName: map[string]*simNode{},
		xidsAfter: map[int][]time.Duration{}, out: PolicyResult{Policy: policy}, cfg: cfg, poolDeleted: map[string][]time.Time{}}
	if policy == PolicyFleetRepair {
		r.pol = cfg.ResolvedPolicy()
	}
	r.nodes = buildNodes(sc)
	for _, n := range r.nodes {
		if r.byName[n.name] != nil {
			return nil, fmt.Errorf("node name %s is used twice (node_name_prefix)", n.name)
		}
		r.byName[n.name] = n
	}
	// Validated even when the configuration has the breakers off
	// (fleetRepairStep then neither evaluates nor consults them).
	bp, err := breaker.NewPolicy(cfg.Breaker.BreakerConfig())
	if err != nil {
		return nil, err
	}
	r.bp = bp
	r.cohortKeys = map[string]bool{}
	for _, k := range bp.Config().Keys() {
		r.cohortKeys[k] = true
	}
	for _, s := range sc.Timeline {
		for _, n := range s.Select.Nodes {
			if r.byName[n] == nil {
				return nil, fmt.Errorf("timeline[%d]: node %s is not in the fleet", s.Index, n)
			}
		}
	}
	r.end = sc.Parameters.End
	for _, o := range occ {
		r.end = max(r.end, o.at)
	}
	return r, nil
}

// run replays the timeline: at every step time and every tick, steps first
// (file order), then the policy, then checkpoints.
func (r *replay) run() {
	tick := r.sc.Parameters.Tick
	oi := 0
	for t := time.Duration(0); ; {
		if r.ctx != nil && r.ctx.Err() != nil {
			return
		}
		now := r.t0.Add(t)
		r.join(t)
		var checkpoints []occurrence
		for ; oi < len(r.occ) && r.occ[oi].at == t; oi++ {
			o := r.occ[oi]
			if o.step.Kind == KindCheckpoint {
				checkpoints = append(checkpoints, o)
				continue
			}
			r.apply(o, now)
		}
		r.policyStep(t, now)
		for _, o := range checkpoints {
			r.checkpoint(o, now)
		}
		if t >= r.end {
			break
		}
		next := min((t/tick+1)*tick, r.end)
		if oi < len(r.occ) {
			next = min(next, r.occ[oi].at)
		}
		t = next
	}
	r.finish()
}

func (r *replay) join(t time.Duration) {
	for _, n := range r.nodes {
		if !n.joined && n.joinAt <= t {
			n.joined = true
			r.fleetDirty = true
		}
	}
}

// stepRNG returns the random source of one step occurrence: selections do
// not depend on what other steps drew, so every policy sees the same picks.
func (r *replay) stepRNG(o occurrence) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d", o.step.Index, o.n)
	return rand.New(rand.NewPCG(r.sc.Seed, h.Sum64()))
}

func (s Selector) matches(name string, attrs map[string]string) bool {
	if len(s.Nodes) > 0 && !slices.Contains(s.Nodes, name) {
		return false
	}
	for k, vs := range s.Attrs {
		if !slices.Contains(vs, attrs[k]) {
			return false
		}
	}
	return true
}

// selectNodes returns the joined nodes a step picks, in fleet order.
func (r *replay) selectNodes(o occurrence) []*simNode {
	if o.nodes != nil {
		var out []*simNode
		for _, name := range o.nodes {
			if n := r.byName[name]; n != nil && n.joined {
				out = append(out, n)
			}
		}
		return out
	}
	var match []int
	for i, n := range r.nodes {
		if n.joined && o.step.Select.matches(n.name, n.attrs) {
			match = append(match, i)
		}
	}
	c := o.step.Select.Count
	want := len(match)
	switch {
	case c.All:
	case c.Percent > 0:
		want = int(math.Round(c.Percent / 100 * float64(len(match))))
	default:
		want = min(c.N, len(match))
	}
	if want < len(match) {
		rng := r.stepRNG(o)
		rng.Shuffle(len(match), func(i, j int) { match[i], match[j] = match[j], match[i] })
		match = match[:want]
		sort.Ints(match)
	}
	out := make([]*simNode, len(match))
	for i, m := range match {
		out[i] = r.nodes[m]
	}
	return out
}

func (r *replay) apply(o occurrence, now time.Time) {
	s := o.step
	switch s.Kind {
	case KindInject:
		truth := s.Truth
		for _, n := range r.selectNodes(o) {
			t := truth
			if t == "" {
				t = r.inferTruth(s, n)
			}
			r.inject(n, s.Findings, t, o.at, now)
		}
	case KindChange:
		r.change(o, now)
	case KindRecover:
		for _, n := range r.selectNodes(o) {
			r.recover(n, s.Method, o.at)
		}
	case KindResume:
		if r.policy != PolicyFleetRepair {
			return
		}
		st, d, err := breaker.Resume(r.bstate, s.Cohort, s.Actor, "resumed by the scenario", now)
		if err != nil {
			r.out.Notes = append(r.out.Notes, fmt.Sprintf("%s: %v", fmtOffset(o.at), err))
			return
		}
		r.bstate = st
		r.recordDecision(d, o.at)
	}
}

// inferTruth gives an inject step without an explicit truth its ground
// truth: a step that selects by attribute (a zone, a driver version, a
// monitoring image) models a shared cause; one that names its nodes models
// the node's own fault when the findings alone make a hardware condition,
// and a false alarm otherwise.
func (r *replay) inferTruth(s *Step, n *simNode) Truth {
	if len(s.Select.Nodes) == 0 || len(s.Select.Attrs) > 0 {
		return TruthShared
	}
	fs := make([]finding.Finding, 0, len(s.Findings))
	for i, spec := range s.Findings {
		fs = append(fs, toFinding(spec, n.name, "", r.t0, uint64(i+1)))
	}
	h := diagnose.Headline(r.eng.Diagnose(diagnose.Input{Node: n.name, Findings: fs, Now: r.t0}))
	if h.Severity == catalog.SeverityCondition && hardwareClass(h.FaultClass) {
		return TruthBroken
	}
	return TruthHealthy
}

// hardwareClass reports whether a fault class is accelerated hardware.
func hardwareClass(c string) bool {
	switch c {
	case "gpu-lost", "pcie", "memory-uncorrectable", "nvlink", "gpu-hang", "gpu-firmware":
		return true
	}
	return false
}

// FindingFromSpec turns a finding as the case corpus writes it (keys as in
// expected.yaml: detector, gpu_pci, device_pci, xid, count, and any other
// key as an attribute; lists comma-joined) into the wire type, without
// node, boot, time, evidence or ID.
func FindingFromSpec(spec map[string]any) finding.Finding {
	f := finding.Finding{Count: 1}
	for k, v := range spec {
		switch k {
		case "detector":
			f.Detector = fmt.Sprint(v)
		case "gpu_pci":
			if v != nil {
				f.GPUPCI = fmt.Sprint(v)
			}
		case "device_pci":
			f.DevicePCI = fmt.Sprint(v)
		case "xid":
			if x, ok := v.(float64); ok {
				f.Xid = int(x)
			}
		case "count":
			if x, ok := v.(float64); ok && x >= 1 {
				f.Count = int(x)
			}
		default:
			if f.Attrs == nil {
				f.Attrs = map[string]string{}
			}
			f.Attrs[k] = attrValue(v)
		}
	}
	return f
}

// attrValue renders a spec value the way attributes travel: strings,
// numbers without decimals, lists comma-joined.
func attrValue(v any) string {
	if l, ok := v.([]any); ok {
		parts := make([]string, len(l))
		for i, e := range l {
			parts[i] = attrValue(e)
		}
		return strings.Join(parts, ",")
	}
	s, err := scalar(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return s
}

// toFinding turns a scenario finding into the wire type for one node.
func toFinding(spec map[string]any, node, boot string, at time.Time, seq uint64) finding.Finding {
	f := FindingFromSpec(spec)
	f.Node, f.BootID, f.Time, f.Seq = node, boot, at, seq
	f.Evidence = []string{fmt.Sprintf("simulated %s finding %d", f.Detector, seq)}
	f.ID = finding.NewID(f)
	return f
}

// inject hands findings to the node. Repeats of an identical finding in
// one boot are coalesced into its first occurrence plus one running latest
// occurrence carrying the summed count, as the agent's aggregation does:
// the rules see the same counts and the same first and last times, and a
// scrape every 30 s for a day does not make every diagnosis quadratic.
func (r *replay) inject(n *simNode, specs []map[string]any, t Truth, at time.Duration, now time.Time) {
	for _, spec := range specs {
		r.seq++
		f := toFinding(spec, n.name, n.bootID(), now, r.seq)
		n.injected = append(n.injected, injection{at: now, gpu: f.GPUPCI})
		if f.Detector == finding.DetectorXid {
			r.xidsAfter[f.Xid] = append(r.xidsAfter[f.Xid], at)
		}
		key := contentKey(f)
		idx, seen := n.repeats[key]
		switch {
		case !seen:
			n.repeats[key] = [2]int{len(n.findings), -1}
			n.findings = append(n.findings, f)
		case idx[1] < 0:
			n.repeats[key] = [2]int{idx[0], len(n.findings)}
			n.findings = append(n.findings, f)
		default:
			l := &n.findings[idx[1]]
			l.Count += f.Count
			l.Time, l.Seq = f.Time, f.Seq
			l.ID = finding.NewID(*l)
		}
	}
	n.dirty = true
	if _, ok := n.truth[t]; !ok {
		n.truth[t] = now
	}
	if t == TruthBroken && n.brokenSince.IsZero() {
		n.brokenSince = now
	}
}

// contentKey identifies a finding's content in its boot: everything but
// its time, sequence number and count.
func contentKey(f finding.Finding) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|%s|%d", f.BootID, f.Detector, f.GPUPCI, f.DevicePCI, f.Xid)
	for _, k := range sortedKeys(f.Attrs) {
		fmt.Fprintf(&b, "|%s=%s", k, f.Attrs[k])
	}
	return b.String()
}

func (r *replay) change(o occurrence, now time.Time) {
	s := o.step
	var halted []string
	for _, n := range r.selectNodes(o) {
		if r.policy == PolicyFleetRepair && r.sc.Parameters.HaltRollouts {
			if c := r.haltingBreaker(s.Set); c != "" {
				halted = append(halted, n.name)
				continue
			}
		}
		cohortChanged := false
		for k, v := range s.Set {
			old := n.attrs[k]
			if old == v {
				continue
			}
			if r.cohortKeys[k] {
				cohortChanged = true
			}
			// A rollback: back to a value the node ran before, or away from a
			// value whose breaker tripped.
			if n.history[k+"="+v] || slices.Contains(r.trippedCohorts(), k+"="+old) {
				r.lastRevert, r.reverted = o.at, true
			}
			n.history[k+"="+old] = true
			n.attrs[k] = v
		}
		if cohortChanged {
			// Signals describe the node's old configuration.
			n.changedAt = now
			r.fleetDirty = true
		}
	}
	if len(halted) > 0 {
		r.halted = append(r.halted, Halted{At: fmtOffset(o.at), Set: s.Set, Breaker: r.haltingBreaker(s.Set),
			Nodes: len(halted)})
	}
}

// haltingBreaker returns the open breaker that halts a rollout of set.
func (r *replay) haltingBreaker(set map[string]string) string {
	for _, k := range sortedKeys(set) {
		name := breaker.Cohort{Key: k, Value: set[k]}.String()
		if b, ok := r.bstate.Cohorts[name]; ok && b.HaltRollout {
			return name
		}
	}
	return ""
}

func (r *replay) recover(n *simNode, method string, at time.Duration) {
	switch method {
	case MethodReboot, MethodResetGPU:
		n.epoch++
	case MethodDCGMReachable:
		n.dropFindings(func(f finding.Finding) bool {
			return f.Detector == finding.DetectorMonitoring && f.BootID == n.bootID()
		})
		n.dirty = true
		return // the GPUs were never at fault: ground truth unchanged
	case MethodReplace:
		r.replace(n)
	case MethodClear:
		boot := n.bootID()
		n.dropFindings(func(f finding.Finding) bool { return f.BootID == boot })
	}
	n.dirty = true
	if _, broken := n.truth[TruthBroken]; broken {
		r.out.Recovered = append(r.out.Recovered, Repaired{Node: n.name, At: fmtOffset(at), Method: method,
			TimeToRepair: fmtOffset(r.t0.Add(at).Sub(n.brokenSince))})
	}
	clear(n.truth)
}

// dropFindings removes findings and rebuilds the repeat index.
func (n *simNode) dropFindings(drop func(finding.Finding) bool) {
	n.findings = slices.DeleteFunc(n.findings, drop)
	clear(n.repeats)
	for i, f := range n.findings {
		k := contentKey(f)
		if idx, ok := n.repeats[k]; ok {
			n.repeats[k] = [2]int{idx[0], i}
		} else {
			n.repeats[k] = [2]int{i, -1}
		}
	}
}

// replace models Karpenter replacing the node: a fresh machine in the same
// slot, with the same attributes.
func (r *replay) replace(n *simNode) {
	n.gen++
	n.epoch = 0
	n.findings, n.diags, n.injected = nil, nil, nil
	clear(n.repeats)
	n.deletingAt = time.Time{}
	n.head = diagnose.Headline(nil)
	n.vendorBad, n.dirty = false, false
	n.condSince, n.state = time.Time{}, ""
	n.changedAt, n.rp = time.Time{}, nil
	clear(n.truth)
	n.brokenSince = time.Time{}
}

// diagnose re-runs the real rules on a node whose findings changed.
func (r *replay) diagnose(n *simNode, now time.Time) {
	n.dirty = false
	n.diags = r.eng.Diagnose(diagnose.Input{Node: n.name, BootID: n.bootID(), Findings: n.findings, Now: now,
		InstanceType: n.attrs[breaker.KeyInstanceType], SuspectSoftware: r.bstate.SoftwareSuspects(breaker.Node{Name: n.name, Attrs: n.attrs})})
	// fleetrepair's policy turns the reasons it disables into events (no
	// condition, no repair), as the controller does.
	n.diags = r.pol.Apply(r.eng.Catalog(), n.diags, n.attrs[breaker.KeyNodePool])
	n.head = diagnose.Headline(n.diags)
	n.monitorDown = false
	for _, d := range n.diags {
		if d.FaultClass == "monitoring-plane" {
			n.monitorDown = true
		}
	}
	// The vendor agent's view: the newest condition of each type in this boot.
	latest := map[string]finding.Finding{}
	for _, f := range n.findings {
		if f.Detector == finding.DetectorNodeCondition && f.BootID == n.bootID() {
			latest[f.Attr("type")] = f
		}
	}
	n.vendorBad = false
	for typ, f := range latest {
		st := f.Attr("status")
		if diagnose.ConditionBad(typ, st) { // polarity alone, as Karpenter's NodeRepair sees it
			n.vendorBad = true
		}
	}
}

// unhealthy is the node's health as the policy sees it: fleetrepair acts on
// its own condition-severity diagnoses; the baselines act on any bad
// NodeCondition, which includes a vendor agent's (Karpenter's NodeRepair
// watches AcceleratedHardwareReady whatever its reason).
func (r *replay) unhealthy(n *simNode) bool {
	cond := n.head.Severity == catalog.SeverityCondition
	if r.policy == PolicyFleetRepair {
		return cond
	}
	return cond || n.vendorBad
}

// toleration is the node's toleration: the configuration's override
// (repair.toleration, or the scenario's repair_toleration) for every
// policy; else, for fleetrepair, its policy's for the headline diagnosis
// in the node's NodePool (policy.ForDiagnosis, as the controller), for
// the baselines the catalog's; a vendor condition's is the vendor's.
func (r *replay) toleration(n *simNode) time.Duration {
	if d := r.cfg.Repair.Toleration; d > 0 {
		return d
	}
	if n.head.Severity == catalog.SeverityCondition {
		if r.pol != nil {
			return r.pol.ForDiagnosis(r.eng.Catalog(), n.head, n.attrs[breaker.KeyNodePool], 0).Toleration
		}
		return n.head.Toleration()
	}
	return vendorToleration
}

// action is the action fleetrepair's policy executes for the node's
// headline diagnosis: the recommendation, or the policy's.
func (r *replay) action(n *simNode) catalog.Action {
	if r.pol != nil && n.head.Severity == catalog.SeverityCondition {
		return r.pol.ForDiagnosis(r.eng.Catalog(), n.head, n.attrs[breaker.KeyNodePool], 0).Action
	}
	return n.head.Action
}

func (r *replay) policyStep(t time.Duration, now time.Time) {
	for _, n := range r.nodes {
		if n.joined && n.dirty {
			r.diagnose(n, now)
		}
	}
	var candidates []*simNode
	for _, n := range r.nodes {
		if !n.joined {
			continue
		}
		if !n.deletingAt.IsZero() {
			if !now.Before(n.deletingAt.Add(r.sc.Parameters.ReplaceDuration)) {
				r.replace(n)
				n.replacedAt = now
			}
			continue
		}
		if !r.unhealthy(n) {
			if !n.condSince.IsZero() {
				r.endPause(n, t, "resolved: the condition cleared")
				n.condSince, n.state, n.rp = time.Time{}, "", nil
			}
			continue
		}
		if n.condSince.IsZero() {
			n.condSince, n.state, n.everHeld = now, stateTolerating, false
		}
		candidates = append(candidates, n)
	}
	sort.SliceStable(candidates, func(i, j int) bool { return candidates[i].condSince.Before(candidates[j].condSince) })
	switch r.policy {
	case PolicyFleetRepair:
		r.fleetRepairStep(t, now, candidates)
	case PolicyKarpenter:
		r.karpenterStep(t, now, candidates)
	case PolicyNVSentinel:
		r.nvsentinelStep(t, now, candidates)
	}
}

// fleetRepairStep is fleetrepair's policy, the controller's own decision
// code (controller/decide): the breakers on the signals of every joined
// node's diagnoses (decide.Signals), then per unhealthy node, oldest
// condition first, the ledger's next step (decide.Step) and the deletion
// guards (decide.Deletion) with the configuration's budgets
// (config.Config.Budget: the cluster's and the NodePool's deletions per
// hour, the NodePool's deletions in flight, its minimum healthy count),
// carried out on the simulated fleet. Nobody approves.
func (r *replay) fleetRepairStep(t time.Duration, now time.Time, candidates []*simNode) {
	if r.cfg.Breaker.Enabled {
		r.evaluateBreakers(t, now)
	}
	// The controller releases DrainPerPass held repairs per periodic pass
	// (Resync, 10 s by default): a paced rate. A simulator step covers
	// tick/Resync passes, so it releases that many times as many; the drain
	// rate does not depend on the simulation's resolution.
	perStep := max(1, r.cfg.Repair.DrainPerPass*int(r.sc.Parameters.Tick/r.cfg.Repair.Resync))
	released := 0
	take := func() bool {
		if released >= perStep {
			return false
		}
		released++
		return true
	}
	for _, n := range candidates {
		if n.rp == nil {
			tol := decide.Toleration(n.head, r.toleration(n))
			n.rp = &simRepair{state: ledger.Tolerating, tolUntil: now.Add(tol)}
			n.state = stateTolerating
		}
		rp := n.rp
		for range 3 { // awaiting_approval -> approved -> executed in one step, as the controller
			row := decide.Repair{State: rp.state, NodeClaim: "nodeclaim-of-" + n.name, TolerationUntil: rp.tolUntil,
				HeldBy: rp.heldBy, ReleasedBy: rp.releasedBy, Since: rp.since}
			f := decide.Facts{Action: r.action(n), ApprovalTTL: r.cfg.Repair.ApprovalTTL, Drain: take, BreakerAllows: !r.cfg.Breaker.Enabled}
			if decide.NeedsBreakers(row) && r.cfg.Breaker.Enabled {
				f.BreakerAllows, _ = breaker.Allows(r.bstate, breaker.Node{Name: n.name, Attrs: n.attrs})
			}
			next := decide.Step(row, n.head, f, now)
			if next.Kind == decide.Guard {
				r.guard(n, t, now, next)
				break
			}
			if next.Kind != decide.Transition {
				break
			}
			rp.state, rp.since = next.To, now
			if h, ok := next.Set["held_by"].(string); ok {
				rp.heldBy = h
			}
			if rel, ok := next.Set["released_by"].(string); ok {
				rp.releasedBy = rel
			}
			switch next.To {
			case ledger.AwaitingApproval: // the recommended action is not executable
				n.state = stateApproval
				r.out.AwaitingApproval = append(r.out.AwaitingApproval, Approval{Node: n.name, At: fmtOffset(t),
					Reason: n.head.Reason, Action: string(r.action(n))})
			case ledger.Approved: // released by the controller: the guards again
				continue
			default: // expired (nobody approves): the next step opens a new repair
				r.endPause(n, t, "expired: no approval within "+r.cfg.Repair.ApprovalTTL.String())
				n.rp, n.state = nil, ""
			}
			break
		}
	}
}

// evaluateBreakers evaluates the cohort breakers on the signals of every
// joined node's diagnoses (decide.AppendReplacementSignals), as the
// controller's periodic pass.
func (r *replay) evaluateBreakers(t time.Duration, now time.Time) {
	if r.fleetDirty || r.fleet == nil {
		var ns []breaker.Node
		for _, n := range r.nodes {
			if n.joined {
				ns = append(ns, breaker.Node{Name: n.name, Attrs: n.attrs})
			}
		}
		r.fleet = r.bp.Fleet(ns)
		r.fleetDirty = false
	}
	sigs := r.signals[:0]
	for _, n := range r.nodes {
		if !n.joined {
			continue
		}
		from := len(sigs)
		joined := func(string, string) (string, time.Time) { return n.attrs[breaker.KeyNodePool], n.replacedAt }
		sigs = decide.AppendReplacementSignals(sigs, n.diags, now, joined, r.replaced)
		// A node's signals from before its cohort attributes changed
		// describe its old configuration (breaker.Signal): dropped.
		if !n.changedAt.IsZero() {
			sigs = append(sigs[:from], slices.DeleteFunc(sigs[from:], func(s breaker.Signal) bool {
				return !s.Ongoing && !s.At.After(n.changedAt)
			})...)
		}
	}
	r.signals = sigs
	var ds []breaker.Decision
	r.bstate, ds = r.bp.Evaluate(now, r.fleet, sigs, r.bstate)
	for _, d := range ds {
		r.recordDecision(d, t)
	}
}

// guard runs the deletion guards for a decide.Guard step and carries out
// decide.AfterGuard's answer: delete, hold for on-call (a breaker) or wait
// for the budget (retried next step).
func (r *replay) guard(n *simNode, t time.Duration, now time.Time, g decide.Next) {
	hour := now.Add(-time.Hour)
	pool := n.attrs[breaker.KeyNodePool]
	r.deletedAt = slices.DeleteFunc(r.deletedAt, func(x time.Time) bool { return !x.After(hour) })
	r.poolDeleted[pool] = slices.DeleteFunc(r.poolDeleted[pool], func(x time.Time) bool { return !x.After(hour) })
	budget := r.cfg.Budget(pool)
	counts := decide.Counts{Cluster: r.sc.Fleet.Cluster, NodePool: pool, DeletionsLastHour: len(r.deletedAt),
		NodePoolDeletionsLastHour: len(r.poolDeleted[pool])}
	// In flight: the NodePool's deletions of the last
	// config.DefaultDeletingFor (the shadow report's assumption of how long
	// a NodeClaim takes to go), at most until the replacement is ready.
	// Healthy: the NodePool's joined nodes neither deleting nor under a
	// condition (quarantined).
	for _, m := range r.nodes {
		if !m.joined || m.attrs[breaker.KeyNodePool] != pool {
			continue
		}
		switch {
		case !m.deletingAt.IsZero():
			if now.Before(m.deletingAt.Add(config.DefaultDeletingFor)) {
				counts.InFlight++
			}
		case !r.unhealthy(m):
			counts.Healthy++
		}
	}
	err := decide.Deletion(decide.Guards{Budget: budget, Counts: counts,
		Breakers: r.cfg.Breaker.Enabled, State: r.bstate, Node: breaker.Node{Name: n.name, Attrs: n.attrs}, HumanApproved: g.HumanApproved,
		Disruption: simOwners(n),
	}, now)
	after, _ := decide.AfterGuard(g, err)
	switch {
	case err == nil:
		r.deletedAt = append(r.deletedAt, now)
		r.poolDeleted[pool] = append(r.poolDeleted[pool], now)
		n.rp = nil
		r.delete(n, t, now)
	case after.Kind == decide.Transition: // held by a breaker: on-call decides, or the breaker closes
		n.rp.state, n.rp.since, n.rp.heldBy = after.To, now, decide.HeldByBreaker
		r.hold(n, t, strings.TrimSuffix(err.Error(), ": "+decide.ErrHeldByBreaker.Error()))
	case errors.Is(err, decide.ErrBudgetExceeded), errors.Is(err, decide.ErrMinHealthy):
		r.hold(n, t, err.Error())
		n.state = stateBudget
	case after.Hold == decide.HoldDoNotDisrupt || after.Hold == decide.HoldOptOut:
		r.hold(n, t, err.Error())
		n.state, n.rp.waitingOn = stateOwners, after.Hold
	}
}

// simOwners is a simulated node's owners' word on disrupting it: the
// attributes karpenter.sh/do-not-disrupt ("true") and
// fleetrepair.dev/repair ("disabled"), set in a NodePool's attrs or by a
// change step (docs/simulator.md), stand for the annotation and the label
// the live controller reads from the Node, its NodeClaim, NodePool and Pods.
func simOwners(n *simNode) decide.Disruption {
	var d decide.Disruption
	if decide.OptedOut(n.attrs) {
		d.OptOut = "Node " + n.name
	}
	if decide.ObjectDoNotDisrupt(n.attrs) {
		d.DoNotDisrupt = "Node " + n.name
	}
	return d
}

// karpenterStep is Karpenter's NodeRepair rule: a node whose condition has
// outlasted its toleration is replaced unless more than 20% of its NodePool
// is unhealthy, in which case the repair is blocked (NodeRepairBlocked).
func (r *replay) karpenterStep(t time.Duration, now time.Time, candidates []*simNode) {
	total, bad := map[string]int{}, map[string]int{}
	for _, n := range r.nodes {
		if n.joined {
			total[n.attrs[breaker.KeyNodePool]]++
		}
	}
	for _, n := range candidates {
		bad[n.attrs[breaker.KeyNodePool]]++
	}
	for _, n := range candidates {
		if now.Before(n.condSince.Add(r.toleration(n))) {
			continue
		}
		pool := n.attrs[breaker.KeyNodePool]
		if float64(bad[pool]) > karpenterUnhealthyFraction*float64(total[pool]) {
			r.hold(n, t, fmt.Sprintf("NodeRepairBlocked: %d of %d nodes in NodePool %s unhealthy (> 20%%)", bad[pool], total[pool], pool))
			continue
		}
		r.delete(n, t, now)
	}
}

// nvsentinelStep is NVSentinel's rule: when more than 50% of the GPU nodes
// became unhealthy within 5 minutes the breaker trips and stays tripped
// until a human resets it (none does in the simulation); otherwise a node
// is remediated after the toleration.
func (r *replay) nvsentinelStep(t time.Duration, now time.Time, candidates []*simNode) {
	total, recent := 0, 0
	for _, n := range r.nodes {
		if n.joined {
			total++
		}
	}
	for _, n := range candidates {
		if now.Sub(n.condSince) <= nvsentinelWindow {
			recent++
		}
	}
	if !r.nvTripped && float64(recent) > nvsentinelUnhealthyFraction*float64(total) {
		r.nvTripped = true
		r.out.Trips = append(r.out.Trips, Trip{At: fmtOffset(t), Cohort: "fleet", Change: "open",
			Message: fmt.Sprintf("%d of %d GPU nodes became unhealthy within 5m (> 50%%)", recent, total)})
	}
	for _, n := range candidates {
		if now.Before(n.condSince.Add(r.toleration(n))) {
			continue
		}
		if r.nvTripped {
			r.hold(n, t, "circuit breaker tripped (> 50% of GPU nodes unhealthy within 5m)")
			continue
		}
		r.delete(n, t, now)
	}
}

func (r *replay) recordDecision(d breaker.Decision, t time.Duration) {
	change := string(d.To)
	r.out.Trips = append(r.out.Trips, Trip{At: fmtOffset(t), Cohort: d.Cohort, Change: change, Cause: string(d.Cause),
		Message: d.Message, Evidence: &d.Evidence})
}

func (r *replay) hold(n *simNode, t time.Duration, why string) {
	if n.held {
		return
	}
	n.state = stateHeld
	r.out.Paused = append(r.out.Paused, Pause{Node: n.name, Since: fmtOffset(t), By: why})
	n.held, n.heldIdx = true, len(r.out.Paused)-1
	if !n.everHeld {
		n.everHeld = true
		r.out.Summary.RepairsHeld++
	}
}

func (r *replay) endPause(n *simNode, t time.Duration, outcome string) {
	if !n.held {
		return
	}
	p := &r.out.Paused[n.heldIdx]
	p.Until, p.Outcome = fmtOffset(t), outcome
	n.held = false
}

func (r *replay) delete(n *simNode, t time.Duration, now time.Time) {
	r.endPause(n, t, "deleted after the hold ended")
	truth := "no-fault"
	switch {
	case hasTruth(n, TruthBroken):
		truth = string(TruthBroken)
		r.ttrs = append(r.ttrs, now.Sub(n.brokenSince))
	case hasTruth(n, TruthShared):
		truth = string(TruthShared)
		r.out.Summary.SharedCauseDeleted++
	default:
		r.out.Summary.NoFaultDeleted++
	}
	d := Deletion{Node: n.name, At: fmtOffset(t), Reason: n.head.Reason, Action: string(n.head.Action), Truth: truth}
	if d.Reason == "" || n.head.Severity != catalog.SeverityCondition {
		d.Reason = "vendor NodeCondition"
	}
	if truth == string(TruthBroken) {
		d.TimeToRepair = fmtOffset(now.Sub(n.brokenSince))
	}
	r.out.Deletions = append(r.out.Deletions, d)
	n.deletions++
	r.replaced = append(r.replaced, breaker.Replaced{Pool: n.attrs[breaker.KeyNodePool], FaultClass: n.head.FaultClass, At: now})
	clear(n.truth)
	n.brokenSince = time.Time{}
	// Karpenter drains the node while it launches the replacement; the old
	// machine (and what it reports) stays until the replacement is ready.
	n.deletingAt, n.state = now, stateDeleting
}

func hasTruth(n *simNode, t Truth) bool {
	_, ok := n.truth[t]
	return ok
}

func (r *replay) finish() {
	for _, n := range r.nodes {
		if n.rp != nil {
			r.out.Open = append(r.out.Open, OpenRepair{Node: n.name, State: string(n.rp.state), HeldBy: n.rp.heldBy,
				Waiting: n.state == stateBudget, WaitingOn: n.rp.waitingOn})
		}
		r.endPause(n, r.end, "still held at the end")
		if hasTruth(n, TruthBroken) {
			r.out.Unrepaired = append(r.out.Unrepaired, Unrepaired{Node: n.name, BrokenSince: fmtOffset(n.brokenSince.Sub(r.t0)),
				State: stateOrNone(n)})
		}
	}
	s := &r.out.Summary
	s.Deletions = len(r.out.Deletions)
	s.HealthyCauseDeleted = s.SharedCauseDeleted + s.NoFaultDeleted
	s.BrokenUnrepaired = len(r.out.Unrepaired)
	s.LoneRepaired = len(r.ttrs)
	s.RecoveredByTimeline = len(r.out.Recovered)
	if len(r.ttrs) > 0 {
		var sum time.Duration
		for _, d := range r.ttrs {
			sum += d
			s.LoneTTRMaxSeconds = max(s.LoneTTRMaxSeconds, d.Seconds())
		}
		s.LoneTTRMeanSeconds = math.Round(sum.Seconds() / float64(len(r.ttrs)))
	}
	for _, tr := range r.out.Trips {
		if tr.Change == "open" {
			s.Trips++
		}
	}
}

func stateOrNone(n *simNode) string {
	if n.state == "" {
		return "healthy-looking"
	}
	return n.state
}

// fmtOffset prints an offset compactly: 5m, 1h, 1h30m, 1m30s, 192h.
func fmtOffset(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
