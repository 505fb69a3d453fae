package shadow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/policy"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// schemaBudget is the clusters table's default budgets (migrations 00001
// and 00004, the controller configuration's defaults), for a cluster
// without a row (nodes always have one: the store creates it on ingest).
var schemaBudget = func() Budget {
	d := config.Default().Budgets
	return Budget{DeletionsPerHour: d.DeletionsPerHour, MaxInFlightPerNodePool: d.MaxInFlightPerNodePool, NodePoolDeletionsPerHour: d.NodePoolDeletionsPerHour}
}()

// node is one stored node during the replay. Its key, "cluster/node", is
// the breaker's node name, as in controller/repair.
type node struct {
	cluster, name, key string
	pool               string
	hasNodeClaim       bool
	attrs              map[string]string
	inventory          int           // GPUs in the newest heartbeat (diagnose.Input.InventoryGPUs)
	gpus               []finding.GPU // the newest heartbeat's GPU list (diagnose.Input.Inventory)
	// owners is the owners' word on disrupting the node, as the live
	// deletion guard last recorded it (store.Node OptOut, DoNotDisrupt):
	// the replay applies it to the whole range.
	owners decide.Disruption
	joinAt time.Time
	joined bool

	fs        []timed // every loaded finding, in the store's order (at never decreases)
	truncated bool
	next      int    // fs[:next] are delivered
	boot      string // the boot ID of the newest delivered finding: the node's current boot

	dirty    bool      // findings delivered since the last diagnosis
	nextDiag time.Time // a node with many findings is diagnosed again no earlier than this
	recheck  time.Time // a finding leaves a time window after this: diagnose again
	volatile bool      // an untimed finding is in the input: the diagnosis's times are "now"
	diags    []diagnose.Diagnosis
	head     diagnose.Diagnosis
	rp       *openRepair
	// gone: the replay deleted the node's NodeClaim. Its replacement (same
	// cohorts, no findings) takes its place in the fleet; the real node's
	// later findings are not delivered.
	gone bool
}

// newNode is a stored node in the replay, with the cohort attributes the
// live controller gives it (controller/repair breakerNode): its Kubernetes
// facts, the agent's versions and the configured label cohorts (labels,
// from the labels the store kept for it).
func newNode(sn store.Node, labels []string) *node {
	attrs := map[string]string{
		breaker.KeyCluster: sn.Cluster, breaker.KeyNodePool: sn.NodePool, breaker.KeyZone: sn.Zone,
		breaker.KeyInstanceType: sn.InstanceType, breaker.KeyKernel: sn.KernelVersion,
		breaker.KeyDriverVersion: sn.DriverVersion,
	}
	for _, l := range labels {
		if v := sn.Labels[l]; v != "" {
			attrs[l] = v
		}
	}
	inv := 0
	var gpus []finding.GPU
	if sn.Heartbeat != nil {
		inv, gpus = max(sn.Heartbeat.GPUCount, len(sn.Heartbeat.GPUs)), sn.Heartbeat.GPUs
	}
	return &node{cluster: sn.Cluster, name: sn.Name, key: sn.Cluster + "/" + sn.Name, pool: sn.NodePool,
		hasNodeClaim: sn.NodeClaim != "", attrs: attrs, inventory: inv, gpus: gpus, joinAt: sn.CreatedAt, head: diagnose.Headline(nil),
		owners: decide.Disruption{OptOut: sn.OptOut, DoNotDisrupt: sn.DoNotDisrupt}}
}

func (n *node) bnode() breaker.Node { return breaker.Node{Name: n.key, Attrs: n.attrs} }

// openRepair is the node's open repair, as the ledger would hold it.
type openRepair struct {
	reason     string
	state      ledger.State // tolerating, awaiting_approval, approved; failed (sticky until healthy)
	tolStart   time.Time
	tolUntil   time.Time
	heldBy     string    // WhyBreaker or WhyActionNotExecutable while awaiting approval
	heldSince  time.Time // when it entered awaiting_approval (the expiry clock)
	approval   int       // index of its Approval in the report, -1 for none
	releasedBy bool      // released by the controller: the breaker guard applies again
	delayed    bool      // a budget delay was reported
	waitingOn  string    // the owners' hold (decide.HoldDoNotDisrupt, HoldOptOut) on the deletion, "" none
}

type arrival struct {
	at time.Time
	n  *node
}

type replay struct {
	cfg          Config
	since, until time.Time
	out          *Report
	budgets      map[string]Budget

	nodes    []*node
	arrivals []arrival // every finding, by delivery time
	ai       int
	joins    []*node // nodes by join time
	ji       int

	fleet      *breaker.Fleet
	fleetDirty bool
	bstate     breaker.State
	openTrips  map[string]int // cohort -> index of its open Trip

	// active holds the nodes with a diagnosis or an open repair: the only
	// ones a pass looks at.
	active        map[*node]bool
	activeList    []*node // active, by key; rebuilt when activeChanged
	activeChanged bool
	deletedAt     map[string][]time.Time // cluster -> deletions in the last hour
	inFlight      map[string][]time.Time // cluster/nodepool -> deletions still in flight
	poolDeletedAt map[string][]time.Time // cluster/nodepool -> deletions in the last hour
	released      int                    // breaker-held repairs released in this pass
	ignored       int                    // findings of deleted nodes not delivered
	throttled     map[*node]bool         // nodes whose diagnosis was deferred at least once
	sigs          []breaker.Signal       // buffers every pass reuses
	cands         []*node
}

func newReplay(cfg Config, since, until time.Time) *replay {
	r := &replay{cfg: cfg, since: since, until: until, budgets: map[string]Budget{}, openTrips: map[string]int{},
		active: map[*node]bool{}, deletedAt: map[string][]time.Time{}, inFlight: map[string][]time.Time{},
		poolDeletedAt: map[string][]time.Time{}, throttled: map[*node]bool{}}
	r.out = &Report{Since: since, Until: until, Deletions: []Deletion{}, ApprovalsNeeded: []Approval{}, Trips: []Trip{},
		BudgetDelays: []BudgetDelay{}, Failed: []Failed{}, ByReason: map[string]*ReasonCounts{},
		Policy: PolicyView{PolicyOverrides: cfg.Policy != nil, ResyncSeconds: cfg.Resync.Seconds(),
			DrainPerPass: cfg.DrainPerPass, ApprovalTTLSeconds: cfg.ApprovalTTL.Seconds(),
			DeletingForSeconds: cfg.DeletingFor.Seconds(), LookbackSeconds: cfg.Lookback.Seconds(),
			CatalogVersion: cfg.Engine.Catalog().Version}}
	if cfg.Toleration > 0 {
		r.out.Policy.TolerationOverride = cfg.Toleration.String()
	}
	if cfg.Breaker != nil {
		bc := cfg.Breaker.Config()
		r.out.Policy.Breakers = &bc
	}
	return r
}

func (r *replay) note(format string, args ...any) {
	r.out.Notes = append(r.out.Notes, fmt.Sprintf(format, args...))
}

// index takes the nodes known before until (a node joins at its row's
// creation, or its first finding when that is earlier), sets their driver
// version at the start, and builds the arrival and join queues.
func (r *replay) index(nodes []*node) {
	for _, n := range nodes {
		if len(n.fs) > 0 && n.fs[0].at.Before(n.joinAt) {
			n.joinAt = n.fs[0].at // reported before the node row existed (a spooled report)
		}
		if n.joinAt.Before(r.until) {
			r.nodes = append(r.nodes, n)
		}
	}
	for _, n := range r.nodes {
		// The store keeps the current driver version only; the first
		// driver-version finding tells what the node ran back then, and
		// later ones move it (a rollout) when they are delivered.
		for _, t := range n.fs {
			if v := driverVersion(t.f); v != "" {
				n.attrs[breaker.KeyDriverVersion] = v
				break
			}
		}
		for _, t := range n.fs {
			r.arrivals = append(r.arrivals, arrival{at: t.at, n: n})
			if !t.at.Before(r.since) {
				r.out.Findings++
				if t.untimed {
					r.out.UntimedFindings++
				}
			}
		}
	}
	sort.SliceStable(r.arrivals, func(i, j int) bool { return r.arrivals[i].at.Before(r.arrivals[j].at) })
	r.joins = append([]*node(nil), r.nodes...)
	sort.SliceStable(r.joins, func(i, j int) bool { return r.joins[i].joinAt.Before(r.joins[j].joinAt) })
	r.out.Nodes = len(r.nodes)
}

func driverVersion(f finding.Finding) string {
	if f.Detector != finding.DetectorDriverVersion {
		return ""
	}
	return f.Attr(finding.AttrValue)
}

// run replays the range pass by pass, one pass per Resync as the
// controller's periodic pass, skipping quiet stretches where no decision can
// change (no open repair, no condition, no breaker open, no recent fault
// signal) to the next finding.
func (r *replay) run(ctx context.Context) error {
	now := r.since
	for pass := 0; ; pass++ {
		if pass%512 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		quiet := r.pass(now)
		next := now.Add(r.cfg.Resync)
		if quiet {
			ev, ok := r.nextEvent()
			if !ok {
				break
			}
			if ev.After(next) {
				// The first pass at or after the event, on the pass grid.
				k := (ev.Sub(r.since) + r.cfg.Resync - 1) / r.cfg.Resync
				next = r.since.Add(k * r.cfg.Resync)
			}
		}
		if !next.Before(r.until) {
			break
		}
		now = next
	}
	r.finish()
	return nil
}

// nextEvent returns when something next happens on its own: a finding
// arrives, a node joins, or a finding leaves a diagnosis window.
func (r *replay) nextEvent() (time.Time, bool) {
	var at time.Time
	take := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	if r.ai < len(r.arrivals) {
		take(r.arrivals[r.ai].at)
	}
	if r.ji < len(r.joins) {
		take(r.joins[r.ji].joinAt)
	}
	for n := range r.active {
		if !n.recheck.IsZero() {
			take(n.recheck.Add(time.Nanosecond))
		}
	}
	return at, !at.IsZero()
}

// pass is one controller pass at now: findings that arrived are delivered
// and their nodes diagnosed (the ingest-triggered reconcile), the breakers
// evaluated over the active diagnoses, then every unhealthy node's repair
// advanced. It reports whether the fleet is quiet (see run).
func (r *replay) pass(now time.Time) bool {
	r.released = 0
	for r.ji < len(r.joins) && !r.joins[r.ji].joinAt.After(now) {
		r.joins[r.ji].joined = true
		r.fleetDirty = true
		r.ji++
	}
	for r.ai < len(r.arrivals) && !r.arrivals[r.ai].at.After(now) {
		n := r.arrivals[r.ai].n
		r.ai++
		t := n.fs[n.next]
		n.next++
		if n.gone {
			r.ignored++
			continue
		}
		if t.f.BootID != "" {
			n.boot = t.f.BootID
		}
		if v := driverVersion(t.f); v != "" && v != n.attrs[breaker.KeyDriverVersion] {
			n.attrs[breaker.KeyDriverVersion] = v
			r.fleetDirty = true
		}
		n.dirty = true
		if !r.active[n] {
			r.active[n], r.activeChanged = true, true
		}
	}

	if r.activeChanged {
		r.activeList = r.activeList[:0]
		for n := range r.active {
			r.activeList = append(r.activeList, n)
		}
		sort.Slice(r.activeList, func(i, j int) bool { return r.activeList[i].key < r.activeList[j].key })
		r.activeChanged = false
	}
	nodes := r.activeList
	busy := false // a node needs diagnosing at a later pass
	for _, n := range nodes {
		if n.dirty || n.volatile || !n.recheck.IsZero() && now.After(n.recheck) {
			if now.Before(n.nextDiag) {
				r.throttled[n] = true
			} else {
				r.diagnose(n, now)
			}
		}
		busy = busy || n.volatile || n.dirty
	}

	signalled := r.evaluateBreakers(now, nodes)

	// Repairs in the order their conditions began (then by name): the
	// deletion budgets go to the oldest first.
	cands := r.cands[:0]
	for _, n := range nodes {
		if !n.gone && (n.rp != nil || n.head.Severity == catalog.SeverityCondition) {
			cands = append(cands, n)
		}
	}
	start := func(n *node) time.Time {
		if n.rp != nil {
			return n.rp.tolStart
		}
		return now
	}
	slices.SortStableFunc(cands, func(a, b *node) int { return start(a).Compare(start(b)) })
	for _, n := range cands {
		r.reconcile(n, now)
	}
	r.cands = cands

	open := false
	for _, n := range nodes {
		if n.rp != nil || n.head.Severity == catalog.SeverityCondition {
			open = true
		}
		if n.gone || len(n.diags) == 0 && n.rp == nil && !n.dirty { // a throttled node stays until diagnosed
			delete(r.active, n)
			r.activeChanged = true
		}
	}
	return !open && !busy && !signalled && !r.bstate.Tripped()
}

// diagnose runs the real rules on what repair.ReconcileNode reads at now —
// every finding of the current boot (and those without a boot ID or a
// time), earlier boots' only within the lookback — with the current boot's
// ID; then the operator policy.
func (r *replay) diagnose(n *node, now time.Time) {
	n.dirty, n.volatile, n.recheck = false, false, time.Time{}
	later := func(c time.Time) {
		if !c.Before(now) && (n.recheck.IsZero() || c.Before(n.recheck)) {
			n.recheck = c
		}
	}
	// The controller reads a node's newest diagnoseLimit findings (the
	// store's FindingsForNode), then drops earlier boots' outside the
	// lookback: so does the replay, of what was delivered by now.
	fs := make([]finding.Finding, 0, min(n.next, diagnoseLimit))
	for _, t := range n.fs[max(0, n.next-diagnoseLimit):n.next] {
		f := t.f
		always := f.BootID == "" || f.BootID == n.boot || f.Time.IsZero()
		if !always && now.Sub(f.Time) > r.cfg.Lookback {
			continue // an earlier boot's history, out of the lookback
		}
		fs = append(fs, f)
		n.volatile = n.volatile || t.untimed
		// A diagnosis changes with time alone when a finding leaves the
		// repeat window or, for an earlier boot's, the lookback (both drop
		// it once now - t exceeds them): look again then.
		later(t.at.Add(r.cfg.RepeatWindow))
		if !always {
			later(f.Time.Add(r.cfg.Lookback))
		}
	}
	// A diagnosis reads every finding (about 2.5 µs each), so a chatty node
	// costs the square of its findings over a replay; the controller pays it
	// in real time, once per report. So the node is diagnosed again no
	// sooner than Resync per throttleFindings findings of its input (1,000
	// findings: 5.5 min), which keeps a week of a node with 5,000 findings to
	// a few seconds; its decisions may lag by that much, and the report's
	// notes say so.
	n.nextDiag = now.Add(r.cfg.Resync * time.Duration(len(fs)/throttleFindings))
	ds := r.cfg.Engine.Diagnose(diagnose.Input{Cluster: n.cluster, Node: n.name, BootID: n.boot, Findings: fs, Now: now,
		InstanceType: n.attrs[breaker.KeyInstanceType], SuspectSoftware: r.bstate.SoftwareSuspects(n.bnode()), InventoryGPUs: n.inventory, Inventory: n.gpus})
	n.diags = r.applyPolicy(ds, n.pool)
	n.head = diagnose.Headline(n.diags)
}

// evaluateBreakers is repair.EvaluateBreakers on the replay's state: the
// signals of the active diagnoses (decide.Signals).
// It reports whether a new-failure signal lies within the window (the
// breakers may still trip on it).
func (r *replay) evaluateBreakers(now time.Time, nodes []*node) bool {
	if r.cfg.Breaker == nil {
		return false
	}
	if r.fleetDirty || r.fleet == nil {
		var bn []breaker.Node
		for _, n := range r.nodes {
			if n.joined {
				bn = append(bn, n.bnode())
			}
		}
		r.fleet = r.cfg.Breaker.Fleet(bn)
		r.fleetDirty = false
	}
	sigs := r.sigs[:0]
	var latest time.Time
	for _, n := range nodes {
		if n.gone {
			continue
		}
		from := len(sigs)
		sigs = decide.AppendSignals(sigs, n.diags, now)
		for _, sg := range sigs[from:] {
			if !sg.Ongoing && sg.At.After(latest) {
				latest = sg.At
			}
		}
	}
	r.sigs = sigs
	recent := !latest.IsZero() && latest.After(now.Add(-r.cfg.Breaker.Config().Window))
	if !recent && !r.bstate.Tripped() {
		// Nothing can change: trips and the ceiling need new-failure
		// signals within the window (ongoing ones count towards neither),
		// and nothing is open to cool down. Skipping keeps a week of held
		// repairs cheap to replay.
		return false
	}
	var ds []breaker.Decision
	r.bstate, ds = r.cfg.Breaker.Evaluate(now, r.fleet, sigs, r.bstate)
	for _, d := range ds {
		switch d.To {
		case breaker.Open:
			r.out.Trips = append(r.out.Trips, Trip{Cohort: d.Cohort, Scope: string(d.Scope), At: d.At, Message: d.Message,
				HaltRollout: d.HaltRollout, Evidence: d.Evidence})
			r.openTrips[d.Cohort] = len(r.out.Trips) - 1
		case breaker.Closed:
			if i, ok := r.openTrips[d.Cohort]; ok {
				at := d.At
				r.out.Trips[i].ClosedAt, r.out.Trips[i].CloseCause = &at, string(d.Cause)
				delete(r.openTrips, d.Cohort)
			}
		}
	}
	return recent
}

// reconcile is repair.ReconcileNode's ledger part for one node: it feeds
// decide.Step the repair, the headline diagnosis and the replay's facts,
// and carries out its answer on the report.
func (r *replay) reconcile(n *node, now time.Time) {
	head := n.head
	if n.rp == nil && head.Severity != catalog.SeverityCondition {
		return
	}
	if n.rp == nil {
		tol := decide.Toleration(head, r.effective(head, n.pool).Toleration)
		n.rp = &openRepair{reason: head.Reason, state: ledger.Tolerating, tolStart: now, tolUntil: now.Add(tol), approval: -1}
		r.counts(head.Reason).Repairs++
	}
	rp := n.rp
	if decide.Retarget(rp.state, rp.reason, head) {
		rp.reason = head.Reason // live: store.RetargetRepair
	}
	if rp.state == ledger.Failed {
		// Reported once per condition, until the node is healthy again
		// (docs/shadow.md, "Failed repairs").
		if head.Severity != catalog.SeverityCondition {
			n.rp = nil
		}
		return
	}
	for range 3 { // awaiting_approval -> approved -> executed in one pass, as repair.advance
		row := rp.row(n)
		f := decide.Facts{Action: r.effective(head, n.pool).Action, ApprovalTTL: r.cfg.ApprovalTTL, Drain: r.takeRelease}
		if decide.NeedsBreakers(row) {
			f.BreakerAllows = r.cfg.Breaker == nil
			if !f.BreakerAllows {
				f.BreakerAllows, _ = breaker.Allows(r.bstate, n.bnode())
			}
		}
		next := decide.Step(row, head, f, now)
		switch next.Kind {
		case decide.Guard:
			r.execute(n, rp, next, now)
			return
		case decide.Transition:
		default:
			return
		}
		c := r.counts(rp.reason)
		switch next.To {
		case ledger.Resolved:
			c.Resolved++
			r.endApproval(rp, now, OutcomeResolved)
			n.rp = nil
			return
		case ledger.AwaitingApproval: // the action is not executable
			r.hold(n, rp, now, WhyActionNotExecutable, f.Action, next.Why)
			return
		case ledger.Approved: // released by the controller
			rp.state, rp.releasedBy = ledger.Approved, true
			r.endApproval(rp, now, OutcomeReleased)
		case ledger.Expired:
			c.Expired++
			r.endApproval(rp, now, OutcomeExpired)
			n.rp = nil // the next pass opens a new repair with a full toleration
			return
		case ledger.Failed:
			rp.state = ledger.Failed
			c.Failed++
			r.out.Failed = append(r.out.Failed, Failed{Cluster: n.cluster, Node: n.name, Reason: rp.reason, At: now, Why: next.Why})
			return
		default: // cancelled: a NodeClaim UID the replay does not track
			n.rp = nil
			return
		}
	}
}

// row is what decide.Step reads of the repair. The replay knows whether a
// NodeClaim owns the node, not its name or UID (which never change here).
func (rp *openRepair) row(n *node) decide.Repair {
	row := decide.Repair{State: rp.state, TolerationUntil: rp.tolUntil, Since: rp.heldSince}
	if n.hasNodeClaim {
		row.NodeClaim = "nodeclaim-of-" + n.name
	}
	switch rp.heldBy {
	case WhyBreaker:
		row.HeldBy = decide.HeldByBreaker
	case WhyActionNotExecutable:
		row.HeldBy = decide.HeldByAction
	}
	if rp.releasedBy {
		row.ReleasedBy = decide.Actor
	}
	return row
}

// takeRelease takes one of this pass's paced releases (DrainPerPass).
func (r *replay) takeRelease() bool {
	if r.released >= r.cfg.DrainPerPass {
		return false // paced: the next pass releases more
	}
	r.released++
	return true
}

// execute runs the deletion guards of a decide.Guard step (decide.Deletion,
// as BeginDeletion does) on the replay's budget counts and breaker state,
// and carries out decide.AfterGuard's answer: the deletion, a budget
// delay (retried next pass) or a hold for on-call.
func (r *replay) execute(n *node, rp *openRepair, g decide.Next, now time.Time) {
	err := decide.Deletion(r.guards(n, now, g.HumanApproved), now)
	after, _ := decide.AfterGuard(g, err)
	var budget *decide.BudgetError
	switch {
	case errors.As(err, &budget):
		r.delay(n, rp, now, budget.Budget, budget.Detail)
		return // retried on the next pass
	case after.Kind == decide.Transition && after.To == ledger.AwaitingApproval:
		r.hold(n, rp, now, WhyBreaker, catalog.ActionReplace, after.Why)
		return
	case after.Hold == decide.HoldDoNotDisrupt || after.Hold == decide.HoldOptOut:
		if rp.waitingOn == "" {
			r.counts(rp.reason).OwnersHeld++
		}
		rp.waitingOn = after.Hold
		return // retried on the next pass, as live
	case err != nil:
		return // kill switch or stale state: never in a replay
	}
	c := r.counts(rp.reason)
	pool := n.cluster + "/" + n.pool
	r.deletedAt[n.cluster] = append(r.deletedAt[n.cluster], now)
	r.inFlight[pool] = append(r.inFlight[pool], now)
	r.poolDeletedAt[pool] = append(r.poolDeletedAt[pool], now)
	c.Deletions++
	r.out.Deletions = append(r.out.Deletions, Deletion{Cluster: n.cluster, Node: n.name, NodePool: n.pool, Reason: rp.reason,
		At: now, TolerationStartedAt: rp.tolStart, Released: rp.releasedBy})
	n.gone, n.rp, n.diags, n.head = true, nil, nil, diagnose.Headline(nil)
}

// guards gathers what BeginDeletion and repair's guard give decide.Deletion:
// the cluster's budgets, deletions that entered deleting in (now-1h, now]
// in the cluster and the NodePool, the NodePool's deletions still in
// flight, its healthy nodes against the policy's minHealthy, and the
// breaker state. Healthy here is a node of the pool in the fleet, not
// under a condition (quarantined) and not a replacement still on its way
// (a deletion in flight); the store does not know which nodes were
// NotReady. The breaker state is always fresh: the replay evaluates the
// breakers at every pass where they can change.
func (r *replay) guards(n *node, now time.Time, humanApproved bool) decide.Guards {
	b, known := r.budgets[n.cluster]
	if !known {
		b = schemaBudget
	}
	pool := n.cluster + "/" + n.pool
	inFlight := len(pruneBefore(r.inFlight, pool, now.Add(-r.cfg.DeletingFor)))
	g := decide.Guards{
		Budget: decide.Budget{DeletionsPerHour: b.DeletionsPerHour, MaxInFlightPerNodePool: b.MaxInFlightPerNodePool,
			NodePoolDeletionsPerHour: b.NodePoolDeletionsPerHour, MinHealthy: r.cfg.Policy.MinHealthy(n.pool)},
		Counts: decide.Counts{Cluster: n.cluster, NodePool: n.pool,
			DeletionsLastHour:         len(pruneBefore(r.deletedAt, n.cluster, now.Add(-time.Hour))),
			InFlight:                  inFlight,
			NodePoolDeletionsLastHour: len(pruneBefore(r.poolDeletedAt, pool, now.Add(-time.Hour)))},
		Breakers: r.cfg.Breaker != nil, State: r.bstate, Node: n.bnode(), HumanApproved: humanApproved,
		Disruption: n.owners,
	}
	if g.Budget.MinHealthy > 0 {
		healthy := 0
		for _, m := range r.nodes {
			if m.joined && m.cluster == n.cluster && m.pool == n.pool && m.head.Severity != catalog.SeverityCondition {
				healthy++
			}
		}
		g.Counts.Healthy = healthy - inFlight
	}
	return g
}

// pruneBefore drops the times of m[k] at or before cut and returns the rest.
func pruneBefore(m map[string][]time.Time, k string, cut time.Time) []time.Time {
	ts := m[k]
	for len(ts) > 0 && !ts[0].After(cut) {
		ts = ts[1:]
	}
	m[k] = ts
	return ts
}

// nodePoolPerHour is the per-NodePool hourly budget of a cluster whose
// stored budget is stored: Config.NodePoolDeletionsPerHour when set.
func (r *replay) nodePoolPerHour(stored int) int {
	if r.cfg.NodePoolDeletionsPerHour > 0 {
		return r.cfg.NodePoolDeletionsPerHour
	}
	return stored
}

// delay records, once per repair, that a budget delayed it.
func (r *replay) delay(n *node, rp *openRepair, now time.Time, budget, detail string) {
	if rp.delayed {
		return
	}
	rp.delayed = true
	r.counts(rp.reason).BudgetDelayed++
	r.out.BudgetDelays = append(r.out.BudgetDelays, BudgetDelay{Cluster: n.cluster, Node: n.name, Reason: rp.reason,
		At: now, Budget: budget, Detail: detail})
}

// hold parks the repair for on-call approval.
func (r *replay) hold(n *node, rp *openRepair, now time.Time, why string, action catalog.Action, detail string) {
	rp.state, rp.heldBy, rp.heldSince, rp.releasedBy = ledger.AwaitingApproval, why, now, false
	c := r.counts(rp.reason)
	c.ApprovalsNeeded++
	if why == WhyBreaker {
		c.HeldByBreaker++
	} else {
		c.NotExecutable++
	}
	r.out.ApprovalsNeeded = append(r.out.ApprovalsNeeded, Approval{Cluster: n.cluster, Node: n.name, Reason: rp.reason,
		Why: why, Action: string(action), At: now, Detail: detail, Outcome: OutcomePending})
	rp.approval = len(r.out.ApprovalsNeeded) - 1
}

func (r *replay) endApproval(rp *openRepair, now time.Time, outcome string) {
	if rp.approval < 0 {
		return
	}
	a := &r.out.ApprovalsNeeded[rp.approval]
	a.Outcome, a.Ended = outcome, &now
	rp.approval = -1
}

func (r *replay) counts(reason string) *ReasonCounts {
	c := r.out.ByReason[reason]
	if c == nil {
		c = &ReasonCounts{}
		r.out.ByReason[reason] = c
	}
	return c
}

// effective resolves the policy for a diagnosis in a NodePool.
func (r *replay) effective(d diagnose.Diagnosis, nodePool string) policy.Effective {
	return r.cfg.Policy.ForDiagnosis(r.cfg.Engine.Catalog(), d, nodePool, r.cfg.Toleration)
}

// applyPolicy turns disabled reasons' conditions into events (policy.Apply).
func (r *replay) applyPolicy(ds []diagnose.Diagnosis, nodePool string) []diagnose.Diagnosis {
	return r.cfg.Policy.Apply(r.cfg.Engine.Catalog(), ds, nodePool)
}

func (r *replay) finish() {
	for _, n := range r.nodes {
		if rp := n.rp; rp != nil && rp.state != ledger.Failed {
			o := Open{Cluster: n.cluster, Node: n.name, Reason: rp.reason, State: string(rp.state),
				TolerationStartedAt: rp.tolStart, TolerationUntil: rp.tolUntil}
			if rp.state == ledger.AwaitingApproval {
				o.HeldBy = rp.heldBy
			} else {
				o.WaitingOn = rp.waitingOn
			}
			r.out.Open = append(r.out.Open, o)
		}
	}
	slices.SortStableFunc(r.out.Open, func(a, b Open) int { return a.TolerationStartedAt.Compare(b.TolerationStartedAt) })
	if r.out.UntimedFindings > 0 {
		r.note("%d finding(s) have no observation time; each is diagnosed as happening when it was received, and its windows are the receipt's",
			r.out.UntimedFindings)
	}
	if len(r.throttled) > 0 {
		r.note("%d node(s) reported so many findings that their diagnoses were spaced out (every %s per %d findings read) to keep the replay fast: their decisions may lag by that much",
			len(r.throttled), r.cfg.Resync, throttleFindings)
	}
	if r.ignored > 0 {
		r.note("%d finding(s) of nodes this report deletes arrived after the deletion and are left out: the real nodes kept reporting, their replacements would not have",
			r.ignored)
	}
}
