package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Breakers (docs/design.md, decision 8): every periodic pass evaluates the cohort
// breakers over the whole fleet (every cluster) on the signals
// decide.Signals makes of the active diagnoses, and saves the state
// compare-and-set, so replicas never overwrite each other. Before a
// deletion, the guard transaction re-reads the saved state (through its own
// transaction) and decide.Deletion checks it; a held repair goes to
// awaiting_approval saying which cohort, with which numbers. When the
// breaker closes, held repairs are released at DrainPerPass per pass, each
// re-validated on the way.

// Errors of the deletion guard (controller/decide's, decided there).
var (
	// ErrHeldByBreaker: a breaker holds the node's repair.
	ErrHeldByBreaker = decide.ErrHeldByBreaker
	// ErrKillSwitch: the kill switch is on.
	ErrKillSwitch = decide.ErrKillSwitch
	// ErrBreakerStale: the saved breaker state is older than
	// Config.MaxBreakerAge (or was never evaluated); retried, not held.
	ErrBreakerStale = decide.ErrBreakerStale
	// ErrMinHealthy: the NodePool has fewer healthy Nodes than its
	// policy's minimum.
	ErrMinHealthy = decide.ErrMinHealthy
)

// breakerNode is a node's identity and cohort attributes for the breakers:
// Kubernetes metadata (NodePool, zone, instance type, kernel, OS image,
// configured labels) plus what the agent reports (driver version). Names are
// cluster-qualified: node names repeat across clusters.
func (r *Reconciler) breakerNode(cluster string, info kube.NodeInfo, agent store.Node) breaker.Node {
	attrs := map[string]string{
		"cluster": cluster, "nodepool": info.NodePool, "zone": info.Zone, "instance_type": info.InstanceType,
		"kernel": info.KernelVersion, "image": info.OSImage, "driver_version": agent.DriverVersion,
	}
	if agent.KernelVersion != "" {
		attrs["kernel"] = agent.KernelVersion
	}
	for l, v := range r.cohortLabels(info) {
		attrs[l] = v
	}
	return breaker.Node{Name: cluster + "/" + info.Name, Attrs: attrs}
}

// cohortLabels returns the node's labels the breakers form cohorts of
// (breaker.Config.Labels; nil when none is configured or set). The store
// keeps them with the node's metadata, so the shadow report replays the
// same label cohorts.
func (r *Reconciler) cohortLabels(info kube.NodeInfo) map[string]string {
	if r.cfg.Breaker == nil {
		return nil
	}
	var out map[string]string
	for _, l := range r.cfg.Breaker.Config().Labels {
		if v := info.Labels[l]; v != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[l] = v
		}
	}
	return out
}

// heldNode is what the guard needs to know of the node under repair.
type heldNode struct {
	cluster string
	info    kube.NodeInfo
	agent   store.Node
}

func nodeFromInfo(cluster string, info kube.NodeInfo, agent store.Node) heldNode {
	return heldNode{cluster: cluster, info: info, agent: agent}
}

// loadBreakers reads the saved breaker state.
func (r *Reconciler) loadBreakers(ctx context.Context) (breaker.State, int64, error) {
	doc, v, err := r.cfg.Store.BreakerState(ctx)
	if err != nil {
		return breaker.State{}, v, err
	}
	st, err := decodeBreakers(doc)
	return st, v, err
}

// decodeBreakers decodes a saved breaker state document (nil: never saved,
// the zero State).
func decodeBreakers(doc []byte) (breaker.State, error) {
	var st breaker.State
	if doc == nil {
		return st, nil
	}
	if err := json.Unmarshal(doc, &st); err != nil {
		return breaker.State{}, fmt.Errorf("decode breaker state: %w", err)
	}
	return st, nil
}

// EvaluateBreakers runs one evaluation over the fleet and saves it; the
// periodic pass does the same first, on the Node lists it shares.
func (r *Reconciler) EvaluateBreakers(ctx context.Context) error {
	return r.evaluateBreakers(ctx, r.listFleet(ctx))
}

// evaluateBreakers evaluates over fleet, each cluster's Nodes.
func (r *Reconciler) evaluateBreakers(ctx context.Context, fleet map[string][]kube.NodeInfo) error {
	r.mu.Lock()
	r.released = 0 // a new pass: DrainPerPass more held repairs may go
	r.mu.Unlock()
	if r.cfg.Breaker == nil {
		return nil
	}
	now := r.cfg.Now()
	agents, err := r.cfg.Store.ListNodeVersions(ctx) // breakerNode reads the versions only
	if err != nil {
		return fmt.Errorf("evaluate breakers: %w", err)
	}
	byName := make(map[string]store.Node, len(agents))
	for _, n := range agents {
		byName[n.Cluster+"/"+n.Name] = n
	}
	var active []diagnose.Diagnosis
	var replaced []breaker.Replaced
	var launchFailed []breaker.Node     // replacement NodeClaims that never registered a Node
	infos := map[string]kube.NodeInfo{} // by decide.NodeName
	for _, name := range r.ClusterNames() {
		ds, err := r.cfg.Store.ActiveDiagnoses(ctx, name, "")
		if err != nil {
			return fmt.Errorf("evaluate breakers: %w", err)
		}
		for _, d := range ds {
			active = append(active, diagnose.Diagnosis{Cluster: name, Node: d.Node, FaultClass: d.FaultClass,
				Severity: catalog.Severity(d.Severity), LastSeen: d.LastSeen})
		}
		young := false // a node that joined recently enough to be a replacement
		for _, info := range fleet[name] {
			infos[decide.NodeName(name, info.Name)] = info
			if age := now.Sub(info.Created); age >= 0 && age <= breaker.DefaultReplacementCycle {
				young = true
			}
		}
		claims, _, _ := r.NodeClaims(name)
		unregistered := slices.DeleteFunc(claims, func(c lifecycle.Claim) bool { return c.State != lifecycle.StateNotRegistered })
		if young && len(ds) > 0 || len(unregistered) > 0 {
			rs, err := r.recentReplacements(ctx, name, now)
			if err != nil {
				return fmt.Errorf("evaluate breakers: %w", err)
			}
			replaced = append(replaced, rs...)
			for _, c := range unregistered {
				if breaker.LaunchFailure(decide.NodeName(name, c.NodePool), c.Since, rs) {
					launchFailed = append(launchFailed, breaker.Node{Name: decide.NodeName(name, "nodeclaim/"+c.Name),
						Attrs: map[string]string{"cluster": name, "nodepool": c.NodePool}})
				}
			}
		}
	}
	// The breakers' fleet: nodes whose lifecycle state is a cohort member
	// (lifecycle.State.BreakerMember): never a leaving node (c27), a node
	// not yet initialized only while it is failing (c28's replacements).
	failing := map[string]bool{}
	for _, d := range active {
		if decide.IsSignal(d.FaultClass, d.Severity) {
			failing[decide.NodeName(d.Cluster, d.Node)] = true
		}
	}
	var bn []breaker.Node
	for name, infos := range fleet {
		for _, info := range infos {
			if !info.Lifecycle(now, r.cfg.Lifecycle).BreakerMember(failing[decide.NodeName(name, info.Name)]) {
				continue
			}
			bn = append(bn, r.breakerNode(name, info, byName[name+"/"+info.Name]))
		}
	}
	joined := func(cluster, node string) (string, time.Time) {
		info, ok := infos[decide.NodeName(cluster, node)]
		if !ok {
			return "", time.Time{}
		}
		return decide.NodeName(cluster, info.NodePool), info.Created
	}
	signals := decide.AppendReplacementSignals(nil, active, now, joined, replaced)
	// A replacement that never launched counts against its pool like one
	// that failed the same way (breaker.LaunchFailure): a member of the
	// fleet, failing now, while it stays stuck.
	for _, n := range launchFailed {
		bn = append(bn, n)
		signals = append(signals, breaker.Signal{Node: n.Name, At: now, Replacement: true})
	}
	for attempt := 0; attempt < 3; attempt++ {
		prior, v, err := r.loadBreakers(ctx)
		if err != nil {
			return err
		}
		st, decisions := r.cfg.Breaker.Evaluate(now, r.cfg.Breaker.Fleet(bn), signals, prior)
		doc, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("encode breaker state: %w", err)
		}
		err = r.cfg.Store.SaveBreakerState(ctx, doc, v, toStored(decisions), now)
		if errors.Is(err, store.ErrConflict) {
			continue // another replica evaluated meanwhile
		}
		if err != nil {
			return err
		}
		for _, d := range decisions {
			r.log.WarnContext(ctx, "breaker decision", "scope", d.Scope, "cohort", d.Cohort, "from", d.From, "to", d.To,
				"cause", d.Cause, "halt_rollout", d.HaltRollout, "message", d.Message)
		}
		r.breakersOpen.Set(float64(len(st.Cohorts)))
		r.lastBreakers.Store(&st)
		return nil
	}
	return errors.New("evaluate breakers: state kept changing")
}

// toStored converts breaker decisions for the store.
func toStored(ds []breaker.Decision) []store.BreakerDecision {
	out := make([]store.BreakerDecision, 0, len(ds))
	for _, d := range ds {
		ev, _ := json.Marshal(d.Evidence)
		out = append(out, store.BreakerDecision{At: d.At, Scope: string(d.Scope), Cohort: d.Cohort, From: string(d.From),
			To: string(d.To), Cause: string(d.Cause), Actor: d.Actor, Message: d.Message, HaltRollout: d.HaltRollout, Evidence: ev})
	}
	return out
}

// deletionGuard gathers what the deletion guards need outside the guard
// transaction (the owners' word on disruption, kube.Disruption; the
// NodePool's Nodes when the policy sets a minimum healthy count) and
// returns the guard: a pure check on values
// (decide.Deletion) of the budget numbers and the breaker state that
// BeginDeletion reads through its transaction. No I/O runs while the
// budget row is locked.
func (r *Reconciler) deletionGuard(ctx context.Context, k *kube.Cluster, node heldNode, rp store.Repair, humanApproved bool, now time.Time) (store.DeletionGuard, error) {
	minHealthy := r.cfg.Policy.MinHealthy(rp.NodePool)
	healthy := 0
	if minHealthy > 0 {
		nodes, err := k.Nodes(ctx)
		if err != nil {
			return nil, err
		}
		healthy = healthyNodes(nodes, rp.NodePool, now, r.cfg.Lifecycle)
	}
	owners, err := k.Disruption(ctx, node.info, now)
	if err != nil {
		return nil, err
	}
	if owners.OptOut != node.agent.OptOut || owners.DoNotDisrupt != node.agent.DoNotDisrupt {
		// Kept for the shadow report, which replays the owners' holds.
		if err := r.cfg.Store.SetNodeOwners(ctx, node.cluster, node.info.Name, owners.OptOut, owners.DoNotDisrupt, now); err != nil {
			return nil, err
		}
	}
	bn := r.breakerNode(node.cluster, node.info, node.agent)
	return func(cur store.Repair, b store.DeletionBudget, doc json.RawMessage) error {
		st, err := decodeBreakers(doc)
		if err != nil {
			return err
		}
		return decide.Deletion(r.guards(b, st, bn, minHealthy, healthy, owners, humanApproved), now)
	}, nil
}

// errGuardRecheck: the breaker state read in the guard transaction no
// longer holds the node that heldGuard was built for; the guard is built
// again from every fact (deletionGuard) and run again. Never a deletion.
var errGuardRecheck = errors.New("the breakers no longer hold the node: guards read again")

// heldGuard is the guard of a repair whose node the breakers already hold
// on this replica's last evaluation (decide.BreakerHolds on
// Reconciler.lastBreakers), or nil when they do not: then deletionGuard
// is the guard. In a zone wave every wave repair whose toleration ends
// reaches the guard while the zone breaker holds it; deletionGuard's
// reads (the node's Pods and its NodePool from the API server, the
// NodePool's Nodes for a minimum healthy count) would be made only to be
// refused. heldGuard reads nothing: it decides (decide.Deletion) on the
// owners' word as last recorded (store.Node's OptOut and DoNotDisrupt,
// what the shadow report replays), and only while the breaker state read
// in the guard transaction still holds the node (decide.BreakerHolds);
// otherwise it refuses with errGuardRecheck and the caller runs the full
// guard. So it can only hold, never allow: a deletion always passes
// deletionGuard's guard.
func (r *Reconciler) heldGuard(node heldNode, rp store.Repair, humanApproved bool, now time.Time) store.DeletionGuard {
	last := r.lastBreakers.Load()
	if last == nil {
		return nil
	}
	minHealthy := r.cfg.Policy.MinHealthy(rp.NodePool) // not reached: the breakers decide first
	bn := r.breakerNode(node.cluster, node.info, node.agent)
	owners := decide.Disruption{OptOut: node.agent.OptOut, DoNotDisrupt: node.agent.DoNotDisrupt}
	if !decide.BreakerHolds(r.guards(store.DeletionBudget{}, *last, bn, minHealthy, 0, owners, humanApproved), now) {
		return nil
	}
	return func(cur store.Repair, b store.DeletionBudget, doc json.RawMessage) error {
		st, err := decodeBreakers(doc)
		if err != nil {
			return err
		}
		g := r.guards(b, st, bn, minHealthy, 0, owners, humanApproved)
		if !decide.BreakerHolds(g, now) {
			return errGuardRecheck
		}
		return decide.Deletion(g, now) // never nil here (decide.BreakerHolds)
	}
}

// guards is decide.Guards of a repair's node bn: the budgets and counts
// BeginDeletion read (b), the breaker state st, the NodePool's minimum
// healthy count and healthy Nodes, the owners' word.
func (r *Reconciler) guards(b store.DeletionBudget, st breaker.State, bn breaker.Node, minHealthy, healthy int, owners decide.Disruption, humanApproved bool) decide.Guards {
	return decide.Guards{
		Budget: decide.Budget{DeletionsPerHour: b.DeletionsPerHour, MaxInFlightPerNodePool: b.MaxInFlightPerNodePool,
			NodePoolDeletionsPerHour: b.NodePoolDeletionsPerHour, MinHealthy: minHealthy},
		Counts: decide.Counts{Cluster: b.Cluster, NodePool: b.NodePool, DeletionsLastHour: b.DeletionsLastHour,
			InFlight: b.InFlight, NodePoolDeletionsLastHour: b.NodePoolDeletionsLastHour, Healthy: healthy},
		Breakers: r.cfg.Breaker != nil, State: st, Node: bn, HumanApproved: humanApproved, MaxBreakerAge: r.cfg.MaxBreakerAge,
		Disruption: owners,
	}
}

// healthyNodes counts the NodePool's healthy Nodes: Ready, not
// quarantined, and capacity in Karpenter's lifecycle (not leaving,
// launching or uninitialized: lifecycle.State.Capacity).
func healthyNodes(nodes []kube.NodeInfo, pool string, now time.Time, g lifecycle.Graces) int {
	healthy := 0
	for _, n := range nodes {
		if n.NodePool != pool || !n.Ready || slices.Contains(n.Taints, kube.QuarantineTaintKey) || !n.Lifecycle(now, g).Capacity() {
			continue
		}
		healthy++
	}
	return healthy
}

// breakerAllows reports whether the breakers let the node's repair proceed
// now (for releasing held repairs).
func (r *Reconciler) breakerAllows(ctx context.Context, node heldNode) (bool, string, error) {
	if r.cfg.Breaker == nil {
		return true, "", nil
	}
	st, _, err := r.loadBreakers(ctx)
	if err != nil {
		return false, "", err
	}
	ok, why := breaker.Allows(st, r.breakerNode(node.cluster, node.info, node.agent))
	return ok, why, nil
}

// allows is breakerAllows on a breaker state already read (true with
// breakers off).
func (r *Reconciler) allows(st breaker.State, node heldNode) bool {
	if r.cfg.Breaker == nil {
		return true
	}
	ok, _ := breaker.Allows(st, r.breakerNode(node.cluster, node.info, node.agent))
	return ok
}

// resumeOf names the human resume that released node's breaker hold since
// heldAt (breaker.ResumeOf over the newest 100 breaker decisions): its actor
// and message, for the released repair's audit. A failed read is logged and
// reported as no resume: the release itself does not wait on it.
func (r *Reconciler) resumeOf(ctx context.Context, node heldNode, heldAt time.Time) (actor, message string, ok bool) {
	rows, err := r.cfg.Store.BreakerDecisions(ctx, 100)
	if err != nil {
		r.log.WarnContext(ctx, "read breaker decisions for a released repair's audit", "cluster", node.cluster, "err", err)
		return "", "", false
	}
	ds := make([]breaker.Decision, 0, len(rows))
	for _, d := range rows {
		ds = append(ds, breaker.Decision{At: d.At, Scope: breaker.Scope(d.Scope), Cohort: d.Cohort, Cause: breaker.Cause(d.Cause),
			Actor: d.Actor, Message: d.Message})
	}
	d, ok := breaker.ResumeOf(ds, r.breakerNode(node.cluster, node.info, node.agent), heldAt)
	return d.Actor, d.Message, ok
}

// recentReplacements lists a cluster's repairs that deleted a NodeClaim
// (executed action replace, not dry run) within three replacement cycles,
// for breaker.ReplacementFailure; Pool is decide.NodeName(cluster,
// nodepool). At is the earliest the deletion could have happened (the end
// of the toleration, else the repair's creation), so a replacement always
// joined after it. One page (store.MaxListLimit) is read: more replacements
// than that in a few hours is what the breakers and the budgets exist to
// stop.
func (r *Reconciler) recentReplacements(ctx context.Context, cluster string, now time.Time) ([]breaker.Replaced, error) {
	rs, _, err := r.cfg.Store.ListRepairs(ctx, store.RepairFilter{Cluster: cluster, Since: now.Add(-3 * breaker.DefaultReplacementCycle), Limit: store.MaxListLimit})
	if err != nil {
		return nil, fmt.Errorf("list recent replacements: %w", err)
	}
	var out []breaker.Replaced
	for _, rp := range rs {
		if rp.DryRun || rp.ExecutedAction != string(catalog.ActionReplace) || rp.State != ledger.Deleting && rp.State != ledger.Replaced {
			continue
		}
		at := rp.TolerationUntil
		if at.IsZero() {
			at = rp.CreatedAt
		}
		out = append(out, breaker.Replaced{Pool: decide.NodeName(cluster, rp.NodePool), FaultClass: rp.FaultClass, At: at})
	}
	return out, nil
}
