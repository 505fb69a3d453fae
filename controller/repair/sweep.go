package repair

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// SweepAgentGrace is how recently a node's agent may have reported for the
// removed-node sweep to leave the node alone although its Node is gone:
// four of the agent's 30 s heartbeats. A machine whose Node was deleted
// stops reporting within it (Karpenter terminates the instance); one that
// keeps reporting counts as present, as a report after a removal always
// has (store.Node.Removed), and is swept once it falls silent.
const SweepAgentGrace = 2 * time.Minute

// sweepLogNames bounds the node names one sweep's log line carries.
const sweepLogNames = 20

// sweepRemoved marks removed, per cluster of fleet that this replica leads,
// the stored nodes its Node list no longer holds (store.SweepRemovedNodes):
// Nodes deleted while no controller watched, or whose delete event the
// informer missed, which no reconcile would ever reach. fleet is
// listFleet's result, read at listedAt or later: it holds only the
// clusters whose API server answered and whose cache had synced, so an
// outage or a cache still listing sweeps nothing. A cluster listed with no
// Node at all is not swept either: that is what a wrong or reset API
// server answers, and the reconcile of each node still finds a real
// deletion. A swept node with active diagnoses is queued: its reconcile
// (the node-gone path) deactivates them; one with an open repair is
// queued by the pass anyway. Each sweep that marks nodes is logged with
// the count and the first names, and counted in
// fleetrepair_nodes_swept_removed_total.
func (r *Reconciler) sweepRemoved(ctx context.Context, fleet map[string][]kube.NodeInfo, listedAt time.Time) {
	for cluster, nodes := range fleet {
		if !r.leads(cluster) {
			continue
		}
		if len(nodes) == 0 {
			r.log.WarnContext(ctx, "removed-node sweep skipped: the cluster's Node list is empty", "cluster", cluster)
			continue
		}
		names := make([]string, len(nodes))
		for i, n := range nodes {
			names[i] = n.Name
		}
		swept, err := r.cfg.Store.SweepRemovedNodes(ctx, store.NodeSweep{Cluster: cluster, Present: names, ListedAt: listedAt,
			SilentBefore: listedAt.Add(-SweepAgentGrace)}, r.cfg.Now())
		if err != nil {
			r.log.ErrorContext(ctx, "sweep removed nodes", "cluster", cluster, "err", err)
			continue // the next pass sweeps again
		}
		if len(swept) == 0 {
			continue
		}
		r.sweptNodes.WithLabelValues(cluster).Add(float64(len(swept)))
		logged := make([]string, 0, min(len(swept), sweepLogNames))
		for _, n := range swept {
			if len(logged) < sweepLogNames {
				logged = append(logged, n.Name)
			}
			if n.ActiveDiagnoses {
				r.add(nodeKey{cluster, n.Name}, PriorityBackground)
			}
		}
		r.log.InfoContext(ctx, "nodes marked removed: stored as present, their Nodes are gone from the synced cache",
			"cluster", cluster, "count", len(swept), "nodes", logged, "listed_nodes", len(nodes))
	}
}

func newSweptCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetrepair_nodes_swept_removed_total",
		Help: "Nodes marked removed by the periodic pass because their Kubernetes Node is gone from the cluster's synced cache, by cluster."},
		[]string{"cluster"})
}
