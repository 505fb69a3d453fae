package repair

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
)

// Karpenter's lifecycle is not health (docs/design.md, "Karpenter's
// lifecycle is not health"). Every periodic pass classifies every NodeClaim
// of every reachable cluster (lifecycle.Classify, on the Node and NodeClaim
// lists the pass reads anyway) and keeps the result for the
// fleetrepair_nodeclaims gauge, the API and the dashboard (NodeClaims). The
// same classification decides, in one place each:
//   - capacity: healthyNodes counts a node only in a lifecycle.State with
//     Capacity (not leaving, launching or uninitialized);
//   - breaker denominators: evaluateBreakers keeps a node in the fleet only
//     when its state is a BreakerMember;
//   - repairs: a node that is leaving (its NodeClaim or Node carries a
//     deletionTimestamp) gets no new repair, no quarantine and so no
//     second delete (ReconcileNode); a repair already deleting it goes on.
// No lifecycle state writes anything to Kubernetes: fleetrepair never
// deletes a NodeClaim for its lifecycle and never touches a finalizer.

// claimSnapshot is one cluster's classified NodeClaims at a pass.
type claimSnapshot struct {
	at     time.Time
	claims []lifecycle.Claim
}

// nodeClaimGauge is fleetrepair_nodeclaims{cluster,state}.
func nodeClaimGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetrepair_nodeclaims",
		Help: "Karpenter NodeClaims by cluster and lifecycle state (active, drifted, launching, initializing, terminating; stuck: stuck-terminating, not-registered, no-node, not-initialized), as of the last periodic pass. Lifecycle states are never repaired; stuck ones need a human."},
		[]string{"cluster", "state"})
}

// recordClaims keeps a cluster's classified NodeClaims and sets the gauge
// (every state, zeros included, so a cleared state reads 0, not stale);
// the cluster's leader tells the stuck ones as Events (TellStuck).
func (r *Reconciler) recordClaims(ctx context.Context, cluster string, nodes []kube.NodeInfo, facts []lifecycle.Facts, now time.Time) {
	claims := kube.ClassifyFleet(cluster, nodes, facts, now, r.cfg.Lifecycle)
	lifecycle.Sort(claims)
	var stuck []StuckClaim
	for _, c := range claims {
		if c.Stuck {
			stuck = append(stuck, StuckClaim{Name: c.Name, Node: c.Node, State: string(c.State), Detail: c.Detail})
		}
	}
	if r.leads(cluster) {
		r.TellStuck(ctx, cluster, stuck) // one Event per NodeClaim and stuck state
	}
	counts := lifecycle.Count(claims)[cluster]
	for _, s := range lifecycle.States() {
		r.claimGauge.WithLabelValues(cluster, string(s)).Set(float64(counts[s]))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.claims == nil {
		r.claims = map[string]claimSnapshot{}
	}
	r.claims[cluster] = claimSnapshot{at: now, claims: claims}
}

// NodeClaims returns a cluster's NodeClaims as the last periodic pass
// classified them (stuck first), when that pass was, and false when no pass
// has listed the cluster yet (just started, or unreachable since). The
// slice is the caller's.
func (r *Reconciler) NodeClaims(cluster string) ([]lifecycle.Claim, time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.claims[cluster]
	return slices.Clone(s.claims), s.at, ok
}

// leaving reports whether a node's NodeClaim or Node is being deleted.
func leaving(s lifecycle.State) bool {
	return s == lifecycle.StateTerminating || s == lifecycle.StateStuckTerminating
}

// NodeAddresses maps the addresses of a served cluster's Nodes to their
// names (kube.Cluster.NodeAddresses): how job reports' peers named by
// address are placed. An error for a cluster not served now.
func (r *Reconciler) NodeAddresses(ctx context.Context, cluster string) (map[string]string, error) {
	k := r.kubeFor(cluster)
	if k == nil {
		return nil, fmt.Errorf("resolve node addresses: cluster %q is not served", cluster)
	}
	return k.NodeAddresses(ctx)
}
