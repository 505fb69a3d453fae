package repair

import (
	"context"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"golang.org/x/sync/errgroup"
)

// Trigger asks for the node to be reconciled soon. It never blocks; several
// triggers of one node before the worker runs coalesce into one pass.
func (r *Reconciler) Trigger(cluster, node string) {
	r.mu.Lock()
	r.pending[nodeKey{cluster, node}] = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run reconciles triggered nodes as they come and, on its own schedule,
// runs the periodic pass (breaker evaluation, replacement checks, every
// open repair re-enqueued) every Resync and whenever a new condition
// diagnosis asks for a breaker evaluation (EvaluateSoon), until ctx ends.
// It returns nil on cancellation.
//
// The two loops are independent on purpose: a fleet whose heartbeats keep
// the trigger set full must never keep the breakers from being evaluated
// (issue 9: on 1,000 heartbeating nodes the pass never ran and a zone
// wave's NodeClaims were deleted). The deletion guard also refuses a
// breaker state older than MaxBreakerAge, so even a stalled pass cannot
// let a deletion through on stale evidence.
func (r *Reconciler) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		t := time.NewTicker(r.cfg.Resync)
		defer t.Stop()
		for {
			r.enqueueOpen(ctx)
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			case <-r.evaluate:
			}
		}
	})
	g.Go(func() error {
		for {
			r.drain(ctx)
			select {
			case <-ctx.Done():
				return nil
			case <-r.wake:
			}
		}
	})
	return g.Wait()
}

// EvaluateSoon asks the periodic pass to run now (breaker evaluation
// first). It never blocks; requests coalesce.
func (r *Reconciler) EvaluateSoon() {
	select {
	case r.evaluate <- struct{}{}:
	default:
	}
}

// enqueueOpen triggers every node that has an open repair, so toleration
// windows expire and deletions complete without new findings, and every
// node on which another agent reports a problem condition (interop).
func (r *Reconciler) enqueueOpen(ctx context.Context) {
	fleet := r.listFleet(ctx) // one Node list per cluster for the whole pass
	if err := r.evaluateBreakers(ctx, fleet); err != nil {
		r.log.ErrorContext(ctx, "evaluate breakers", "err", err)
	}
	if err := r.verifyReplacements(ctx, fleet); err != nil {
		r.log.ErrorContext(ctx, "verify replacements", "err", err)
	}
	open, err := r.cfg.Store.RepairsInState(ctx, ledger.OpenStates()...)
	if err != nil {
		r.log.ErrorContext(ctx, "list open repairs", "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.failed {
		r.pending[k] = true
	}
	for _, rp := range open {
		if r.leadsLocked(rp.Cluster) {
			r.pending[nodeKey{rp.Cluster, rp.Node}] = true
		}
	}
	for name, nodes := range fleet {
		if !r.leadsLocked(name) {
			continue
		}
		for _, n := range nodes {
			if anyForeignProblem(n.Conditions) {
				r.pending[nodeKey{name, n.Name}] = true
			}
		}
	}
}

// listFleet lists every reachable cluster's Nodes once; it is also the
// reachability probe of every cluster. An unreachable cluster is absent
// from the result (its nodes are unknown).
func (r *Reconciler) listFleet(ctx context.Context) map[string][]kube.NodeInfo {
	out := make(map[string][]kube.NodeInfo, len(r.cfg.Clusters))
	for name, k := range r.cfg.Clusters {
		nodes, err := k.Nodes(ctx)
		r.observe(name, err)
		if err != nil {
			r.log.ErrorContext(ctx, "list nodes", "cluster", name, "err", err)
			continue
		}
		out[name] = nodes
	}
	return out
}

func (r *Reconciler) drain(ctx context.Context) {
	for ctx.Err() == nil {
		r.mu.Lock()
		var k nodeKey
		found := false
		for k = range r.pending {
			found = true
			break
		}
		delete(r.pending, k)
		r.mu.Unlock()
		if !found {
			return
		}
		err := r.ReconcileNode(ctx, k.cluster, k.node)
		r.mu.Lock()
		if r.failed == nil {
			r.failed = map[nodeKey]bool{}
		}
		if err != nil {
			r.failed[k] = true
		} else {
			delete(r.failed, k)
		}
		r.mu.Unlock()
		if err != nil {
			r.reconciles.WithLabelValues("error").Inc()
			r.log.ErrorContext(ctx, "reconcile node", "cluster", k.cluster, "node", k.node, "err", err)
			continue
		}
		r.reconciles.WithLabelValues("ok").Inc()
	}
}

// VerifyReplacements runs the replacement verification of the periodic pass.
func (r *Reconciler) VerifyReplacements(ctx context.Context) error {
	return r.verifyReplacements(ctx, r.listFleet(ctx))
}
