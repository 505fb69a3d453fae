package repair

import (
	"context"
	"sync"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"golang.org/x/sync/errgroup"
)

// Trigger asks for the node to be reconciled soon. It never blocks; the
// work queue deduplicates: several triggers of one node before a worker
// takes it are one reconcile, and a node is never reconciled by two workers
// at once.
// With leader election on, a node of a cluster this replica does not lead
// is forwarded to the leader (PostgreSQL NOTIFY, batched every 50 ms).
func (r *Reconciler) Trigger(cluster, node string) {
	r.mu.Lock()
	forward := r.leading != nil && !r.leading[cluster]
	if forward {
		if len(r.forward) < maxForward {
			r.forward = append(r.forward, store.NodeRef{Cluster: cluster, Node: node})
		} else {
			r.forwardDropped.Inc() // the leader's catch-up pass still finds its findings
		}
	}
	r.mu.Unlock()
	if !forward {
		r.queue.Add(nodeKey{cluster, node})
	}
}

// maxForward bounds the nodes waiting to be forwarded to other replicas.
const maxForward = 100_000

// forwardLoop sends the forwarded triggers every 50 ms until ctx ends; a
// failed send is retried with the next batch.
func (r *Reconciler) forwardLoop(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		r.mu.Lock()
		batch := r.forward
		r.forward = nil
		r.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		if err := r.cfg.Store.NotifyReconcile(ctx, batch); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.log.ErrorContext(ctx, "forward triggers to the leading replica", "nodes", len(batch), "err", err)
			r.mu.Lock()
			if len(r.forward)+len(batch) <= maxForward {
				r.forward = append(batch, r.forward...)
			} else {
				r.forwardDropped.Add(float64(len(batch)))
			}
			r.mu.Unlock()
		}
	}
}

// listen enqueues the nodes other replicas forward, for clusters this
// replica leads, until ctx ends.
func (r *Reconciler) listen(ctx context.Context) error {
	return r.cfg.Store.ListenReconcile(ctx, func(n store.NodeRef) {
		if r.leads(n.Cluster) {
			r.queue.Add(nodeKey{n.Cluster, n.Node})
		}
	}, func(lostAt time.Time) {
		if lostAt.IsZero() {
			return
		}
		r.resetCatchUp(r.cfg.Now().Add(-time.Since(lostAt) - catchUpMargin)) // notifications may have been lost since then
		r.log.InfoContext(ctx, "reconcile listener reconnected; the next pass catches up", "lost_at", lostAt)
	}, func(err error) {
		r.log.WarnContext(ctx, "reconcile listener lost its connection", "err", err)
	})
}

// catchUpMargin covers ingest transactions that commit after the time they
// stamped as received_at.
const catchUpMargin = 5 * time.Second

// catchUp enqueues the led clusters' nodes that had findings stored since
// the last pass (minus catchUpMargin; after a start, a new leadership or a
// listener gap: further back, see resetCatchUp), so triggers lost to a
// crashed replica or a dropped notification cost one Resync, never a missed
// fault.
func (r *Reconciler) catchUp(ctx context.Context, passStart time.Time) {
	r.mu.Lock()
	since, gen := r.catchUpFrom, r.catchUpGen
	r.mu.Unlock()
	if since.IsZero() {
		since = passStart.Add(-r.cfg.CatchUpLookback)
	}
	refs, err := r.cfg.Store.NodesWithFindingsSince(ctx, since)
	if err != nil {
		r.log.ErrorContext(ctx, "catch up on new findings", "err", err)
		return // the next pass tries again from the same point
	}
	for _, n := range refs {
		if r.Serves(n.Cluster) && r.leads(n.Cluster) {
			r.queue.Add(nodeKey{n.Cluster, n.Node})
		}
	}
	r.mu.Lock()
	if r.catchUpGen == gen { // no reset meanwhile
		r.catchUpFrom = passStart.Add(-catchUpMargin)
	}
	r.mu.Unlock()
}

// resetCatchUp makes the next catch-up start at from at the latest (zero:
// CatchUpLookback back).
func (r *Reconciler) resetCatchUp(from time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetCatchUpLocked(from)
}

func (r *Reconciler) resetCatchUpLocked(from time.Time) {
	if from.IsZero() || r.catchUpFrom.IsZero() || from.Before(r.catchUpFrom) {
		r.catchUpFrom = from
	}
	r.catchUpGen++
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
	r.startMembers(ctx) // and every cluster added later (AddCluster)
	r.mu.Lock()
	elected := r.leading != nil
	r.mu.Unlock()
	if elected {
		g.Go(func() error { return r.forwardLoop(ctx) })
		g.Go(func() error { return r.listen(ctx) })
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
	if !r.Serves(k.cluster) {
		r.queue.Forget(k) // removed since it was queued (RemoveCluster)
		return true
	}
	if !r.leads(k.cluster) {
		r.queue.Forget(k) // another replica leads it now; its catch-up covers this node
		return true
	}
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
	r.catchUp(ctx, r.cfg.Now())
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
	now := r.cfg.Now()
	led := make(map[string][]kube.NodeInfo, len(fleet))
	for name, nodes := range fleet {
		if !r.leads(name) {
			continue
		}
		led[name] = nodes
		for _, n := range nodes {
			if anyForeignProblem(r.cfg.Engine, n, now) {
				r.queue.Add(nodeKey{name, n.Name})
			}
		}
	}
	setConditions(r.nodeConditions, countConditions(r.cfg.Engine, led, now))
}

// listFleet reads every reachable cluster's Nodes once (from the informer
// cache of a cached cluster), probing each cluster's API server first: it is
// the reachability check of every cluster. Clusters are read concurrently,
// each within ProbeTimeout, so one dead API server stalls no other. An
// unreachable cluster is absent from the result (its nodes are unknown).
func (r *Reconciler) listFleet(ctx context.Context) map[string][]kube.NodeInfo {
	members := r.memberSnapshot()
	out := make(map[string][]kube.NodeInfo, len(members))
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for name, k := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
			defer cancel()
			err := k.Probe(pctx)
			var (
				nodes  []kube.NodeInfo
				claims []lifecycle.Facts
			)
			if err == nil {
				nodes, claims, err = k.Fleet(pctx)
			}
			r.observe(name, err) // logs when reachability changes, not every pass
			if err != nil {
				return
			}
			r.recordClaims(pctx, name, nodes, claims, r.cfg.Now())
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
