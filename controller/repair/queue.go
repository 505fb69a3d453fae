package repair

import (
	"context"
	"sync"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"golang.org/x/sync/errgroup"
)

// Trigger asks for the node to be reconciled soon. It never blocks; the
// work queue deduplicates: several triggers of one node before a worker
// takes it are one reconcile, and a node is never reconciled by two workers
// at once.
func (r *Reconciler) Trigger(cluster, node string) {
	r.queue.Add(nodeKey{cluster, node})
}

// Run starts every cached cluster's informers (their watches enqueue the
// nodes that change), Workers reconcile workers on the work queue, and the
// periodic pass (breaker evaluation, replacement checks, every open repair
// re-enqueued), which runs every Resync and whenever a new condition
// diagnosis asks for a breaker evaluation (EvaluateSoon), until ctx ends.
// It returns nil on cancellation; it can run once per Reconciler.
//
// The pass and the workers are independent on purpose: a fleet whose
// heartbeats keep the queue full must never keep the breakers from being
// evaluated (issue 9: on 1,000 heartbeating nodes the pass never ran and a
// zone wave's NodeClaims were deleted). The deletion guard also refuses a
// breaker state older than MaxBreakerAge, so even a stalled pass cannot let
// a deletion through on stale evidence.
func (r *Reconciler) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for name, k := range r.cfg.Clusters {
		g.Go(func() error {
			return k.Run(ctx, func(node string) { r.Trigger(name, node) })
		})
	}
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
		<-ctx.Done()
		r.queue.ShutDown() // workers finish their current item, then return
		return nil
	})
	for i := 0; i < r.cfg.Workers; i++ {
		g.Go(func() error {
			for r.work(ctx) {
			}
			return nil
		})
	}
	return g.Wait()
}

// work reconciles one node from the queue; false once the queue shut down.
// A failed reconcile is retried with per-node exponential backoff
// (RetryBase doubling up to RetryMax); a node of a cluster whose API server
// was seen unreachable waits for the next pass instead of a worker.
func (r *Reconciler) work(ctx context.Context) bool {
	k, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(k)
	if r.knownUnreachable(k.cluster) {
		r.queue.AddAfter(k, r.cfg.Resync) // its nodes are unknown; no worker waits on a dead API server
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReconcileTimeout)
	err := r.ReconcileNode(rctx, k.cluster, k.node)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return true // shutting down
		}
		r.reconciles.WithLabelValues("error").Inc()
		r.log.ErrorContext(ctx, "reconcile node", "cluster", k.cluster, "node", k.node, "err", err,
			"retries", r.queue.NumRequeues(k))
		r.queue.AddRateLimited(k)
		return true
	}
	r.queue.Forget(k)
	r.reconciles.WithLabelValues("ok").Inc()
	return true
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
	for _, rp := range open {
		if r.leads(rp.Cluster) {
			r.queue.Add(nodeKey{rp.Cluster, rp.Node})
		}
	}
	for name, nodes := range fleet {
		if !r.leads(name) {
			continue
		}
		for _, n := range nodes {
			if anyForeignProblem(n.Conditions) {
				r.queue.Add(nodeKey{name, n.Name})
			}
		}
	}
}

// listFleet reads every reachable cluster's Nodes once (from the informer
// cache of a cached cluster), probing each cluster's API server first: it is
// the reachability check of every cluster. Clusters are read concurrently,
// each within ProbeTimeout, so one dead API server stalls no other. An
// unreachable cluster is absent from the result (its nodes are unknown).
func (r *Reconciler) listFleet(ctx context.Context) map[string][]kube.NodeInfo {
	out := make(map[string][]kube.NodeInfo, len(r.cfg.Clusters))
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for name, k := range r.cfg.Clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
			defer cancel()
			err := k.Probe(pctx)
			var nodes []kube.NodeInfo
			if err == nil {
				nodes, err = k.Nodes(pctx)
			}
			r.observe(name, err) // logs when reachability changes, not every pass
			if err != nil {
				return
			}
			mu.Lock()
			out[name] = nodes
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// VerifyReplacements runs the replacement verification of the periodic pass.
func (r *Reconciler) VerifyReplacements(ctx context.Context) error {
	return r.verifyReplacements(ctx, r.listFleet(ctx))
}
