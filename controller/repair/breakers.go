package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Breakers (DESIGN.md, decision 8): every periodic pass evaluates the cohort
// breakers over the whole fleet (every cluster) and saves the state
// compare-and-set, so replicas never overwrite each other. Before a
// deletion, the guard transaction re-reads the saved state and asks
// breaker.Allows; a held repair goes to awaiting_approval saying which
// cohort, with which numbers. When the breaker closes, held repairs are
// released at DrainPerPass per pass, each re-validated on the way.

// ErrHeldByBreaker is returned by the deletion guard when a breaker holds
// the node's repair.
var ErrHeldByBreaker = errors.New("held by a breaker")

// Held reasons recorded in a repair's detail ("held_by").
const (
	heldByBreaker = "breaker"
	heldByAction  = "action"
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
	if r.cfg.Breaker != nil {
		for _, l := range r.cfg.Breaker.Config().Labels {
			if v := info.Labels[l]; v != "" {
				attrs[l] = v
			}
		}
	}
	return breaker.Node{Name: cluster + "/" + info.Name, Attrs: attrs}
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
	if err != nil || doc == nil {
		return breaker.State{}, v, err
	}
	var st breaker.State
	if err := json.Unmarshal(doc, &st); err != nil {
		return breaker.State{}, v, fmt.Errorf("decode breaker state: %w", err)
	}
	return st, v, nil
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
	agents, err := r.cfg.Store.ListNodes(ctx, "")
	if err != nil {
		return fmt.Errorf("evaluate breakers: %w", err)
	}
	byName := make(map[string]store.Node, len(agents))
	for _, n := range agents {
		byName[n.Cluster+"/"+n.Name] = n
	}
	var bn []breaker.Node
	for name, infos := range fleet {
		for _, info := range infos {
			if !info.Deleting.IsZero() {
				continue // already leaving: no cohort member, no capacity (c27)
			}
			bn = append(bn, r.breakerNode(name, info, byName[name+"/"+info.Name]))
		}
	}
	var signals []breaker.Signal
	for name := range r.cfg.Clusters {
		ds, err := r.cfg.Store.ActiveDiagnoses(ctx, name, "")
		if err != nil {
			return fmt.Errorf("evaluate breakers: %w", err)
		}
		infos := make(map[string]kube.NodeInfo, len(fleet[name]))
		young := false // a node that joined recently enough to be a replacement
		for _, info := range fleet[name] {
			infos[info.Name] = info
			if age := now.Sub(info.Created); age >= 0 && age <= breaker.DefaultReplacementCycle {
				young = true
			}
		}
		var replaced []breaker.Replaced
		if young && len(ds) > 0 {
			if replaced, err = r.recentReplacements(ctx, name, now); err != nil {
				return fmt.Errorf("evaluate breakers: %w", err)
			}
		}
		for _, d := range ds {
			if d.FaultClass == "none" || d.FaultClass == "provisioning" {
				continue
			}
			node := name + "/" + d.Node
			info := infos[d.Node]
			rep := breaker.ReplacementFailure(info.NodePool, d.FaultClass, info.Created, d.LastSeen, replaced)
			signals = append(signals, breaker.Signal{Node: node, At: d.LastSeen, Replacement: rep})
			if d.Severity == "condition" {
				signals = append(signals, breaker.Signal{Node: node, At: now, Ongoing: true})
			}
		}
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

// ErrKillSwitch is returned by the deletion guard while the kill switch is on.
var ErrKillSwitch = errors.New("the kill switch stops every repair")

// breakerGuard is the deletion guard: it re-reads the saved state inside
// the guard transaction and refuses when the kill switch is on, or (unless
// a human approved this repair) when a breaker holds the node.
func (r *Reconciler) breakerGuard(node heldNode, humanApproved bool) store.DeletionGuard {
	return func(ctx context.Context, _ store.Repair, _ store.DeletionBudget) error {
		st, _, err := r.loadBreakers(ctx)
		if err != nil {
			return err
		}
		if st.KillSwitch.On {
			return fmt.Errorf("kill switch on since %s by %s (%s): %w", st.KillSwitch.Since.Format("2006-01-02T15:04:05Z07:00"),
				st.KillSwitch.Actor, st.KillSwitch.Reason, ErrKillSwitch)
		}
		if r.cfg.Breaker == nil || humanApproved {
			return nil
		}
		if err := r.fresh(st); err != nil {
			return err
		}
		if ok, why := breaker.Allows(st, r.breakerNode(node.cluster, node.info, node.agent)); !ok {
			return fmt.Errorf("%s: %w", why, ErrHeldByBreaker)
		}
		return nil
	}
}

// ErrBreakerStale is returned by the deletion guard when the saved breaker
// state is older than Config.MaxBreakerAge (or was never evaluated): the
// deletion is refused and retried after the next evaluation.
var ErrBreakerStale = errors.New("breaker state too old to decide on")

// fresh returns an ErrBreakerStale error unless st was evaluated within
// MaxBreakerAge of now.
func (r *Reconciler) fresh(st breaker.State) error {
	now := r.cfg.Now()
	if st.EvaluatedAt.IsZero() {
		return fmt.Errorf("breakers not evaluated yet: %w", ErrBreakerStale)
	}
	if age := now.Sub(st.EvaluatedAt); age > r.cfg.MaxBreakerAge {
		return fmt.Errorf("breakers last evaluated %s ago (at %s), bound %s: %w", age.Round(time.Millisecond),
			st.EvaluatedAt.Format(time.RFC3339), r.cfg.MaxBreakerAge, ErrBreakerStale)
	}
	return nil
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

// ErrMinHealthy is returned by the deletion guard when the NodePool has
// fewer healthy Nodes than its policy's minimum.
var ErrMinHealthy = errors.New("NodePool below its minimum healthy count")

// minHealthyGuard refuses a deletion while the repair's NodePool has fewer
// healthy Nodes (Ready, not quarantined) than the policy's minHealthy.
func (r *Reconciler) minHealthyGuard(k *kube.Cluster, rp store.Repair) store.DeletionGuard {
	return func(ctx context.Context, _ store.Repair, _ store.DeletionBudget) error {
		min := r.cfg.Policy.MinHealthy(rp.NodePool)
		if min <= 0 {
			return nil
		}
		nodes, err := k.Nodes(ctx)
		if err != nil {
			return err
		}
		healthy := 0
		for _, n := range nodes {
			if n.NodePool != rp.NodePool || !n.Ready {
				continue
			}
			q := false
			for _, t := range n.Taints {
				if t == kube.QuarantineTaintKey {
					q = true
				}
			}
			if !q {
				healthy++
			}
		}
		if healthy < min {
			return fmt.Errorf("NodePool %s has %d healthy nodes, minimum %d: %w", rp.NodePool, healthy, min, ErrMinHealthy)
		}
		return nil
	}
}

// recentReplacements lists a cluster's repairs that deleted a NodeClaim
// (executed action replace, not dry run) within three replacement cycles,
// for breaker.ReplacementFailure. At is the earliest the deletion could have
// happened (the end of the toleration, else the repair's creation), so a
// replacement always joined after it. One page (store.MaxListLimit) is read:
// more replacements than that in a few hours is what the breakers and the
// budgets exist to stop.
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
		out = append(out, breaker.Replaced{Pool: rp.NodePool, FaultClass: rp.FaultClass, At: at})
	}
	return out, nil
}
