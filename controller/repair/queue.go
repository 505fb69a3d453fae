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
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
)

// Priorities of the work queue (controller-runtime's priorityqueue: the
// highest first, FIFO within one). In a zone wave the work is thousands of
// nodes each needing about three rate-limited API writes (condition, taint,
// Event; --kube-api-qps): one FIFO made the last node's repair open only
// after every earlier node's writes (issue 9: 1,500 nodes, report to repair
// opened p50 15 s, p99 27 s at 200 QPS; the lone failure elsewhere
// deleting 15 s after its toleration ended; docs/scale.md). So:
const (
	// PriorityBackground: what changes nothing urgent: the informers'
	// watches (mostly the echo of our own writes), the periodic pass (open
	// repairs, catch-up, other agents' conditions), a heartbeat whose
	// agent facts changed, forwarded triggers of older replicas.
	PriorityBackground = 0
	// PriorityHeld: the follow-up (Kubernetes writes, ledger steps) of a
	// node whose new repair an open breaker holds: in a zone wave, after the
	// trip, every wave node. Its repair cannot go on anyway; its quarantine
	// writes come after everyone else's.
	PriorityHeld = 1
	// PriorityFollowUp: the follow-up of any other node whose evidence was
	// just recorded at PriorityEvidence (a lone failure outside the wave
	// keeps its taint and toleration clock on time), and a repair whose
	// toleration window ends now (wakeAt).
	PriorityFollowUp = 2
	// PriorityEvidence: a node with newly stored findings (ingest). Its
	// reconcile is the database part only (diagnoses, repair opened:
	// reconcile's ledgerOnly), then the node is queued again at
	// PriorityFollowUp or PriorityHeld. Every repair of a wave opens (and
	// the breakers are evaluated on it) before any node's API writes, and a
	// lone failure elsewhere opens as fast as the wave's.
	PriorityEvidence = 3
)

// Trigger asks for the node to be reconciled soon, at PriorityBackground.
// It never blocks; the work queue deduplicates: several triggers of one
// node before a worker takes it are one reconcile (at the highest priority
// asked), and a node is never reconciled by two workers at once.
// With leader election on, a node of a cluster this replica does not lead
// is forwarded to the leader (PostgreSQL NOTIFY, batched every 50 ms).
func (r *Reconciler) Trigger(cluster, node string) { r.TriggerAt(cluster, node, PriorityBackground) }

// TriggerFindings is Trigger for a node whose report stored new findings
// (PriorityEvidence).
func (r *Reconciler) TriggerFindings(cluster, node string) {
	r.TriggerAt(cluster, node, PriorityEvidence)
}

// TriggerAt is Trigger at priority p (one of the Priority constants). A
// forwarded trigger keeps PriorityEvidence; any other arrives at the leader
// as PriorityBackground.
func (r *Reconciler) TriggerAt(cluster, node string, p int) {
	r.mu.Lock()
	forward := r.leading != nil && !r.leading[cluster]
	if forward {
		if len(r.forward) < maxForward {
			r.forward = append(r.forward, store.NodeRef{Cluster: cluster, Node: node, Findings: p == PriorityEvidence})
		} else {
			r.forwardDropped.Inc() // the leader's catch-up pass still finds its findings
		}
	}
	r.mu.Unlock()
	if !forward {
		r.add(nodeKey{cluster, node}, p)
	}
}

// add queues k at priority p.
func (r *Reconciler) add(k nodeKey, p int) {
	r.queue.AddWithOpts(priorityqueue.AddOpts{Priority: &p}, k)
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
			p := PriorityBackground
			if n.Findings {
				p = PriorityEvidence
			}
			r.add(nodeKey{n.Cluster, n.Node}, p)
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

// DefaultFreshEvidence is the default of Config.FreshEvidence: three of
// the controller's default 15 s Lease durations plus the backlog a wave
// leaves a dying leader (seconds at 10,000 nodes, docs/scale.md).
const DefaultFreshEvidence = 2 * time.Minute

// catchUpMargin covers ingest transactions that commit after the time they
// stamped as received_at.
const catchUpMargin = 5 * time.Second

// catchUp enqueues the led clusters' nodes that had findings stored since
// the last pass (minus catchUpMargin; after a start, a new leadership or a
// listener gap: further back, see resetCatchUp), so triggers lost to a
// crashed replica or a dropped notification cost one Resync, never a missed
// fault.
//
// After such a reset the lost triggers were evidence triggers
// (PriorityEvidence) that nobody handled: the ones the old leader had
// queued when it died, the ones forwarded while no replica led, the ones a
// lost listener connection dropped. So the nodes whose newest finding is
// at or after the reset's evidence point (a listener gap: when it began; a
// start or a new Lease: Config.FreshEvidence back) are queued at
// PriorityEvidence, the newest first (FIFO within a priority): in a
// failover mid-wave the wave's nodes open their repairs before the new
// leader's catch-up of the last CatchUpLookback reaches the healthy nodes,
// which go at PriorityBackground as in every pass (docs/scale.md, "The
// wave with the Lease holder killed": p99 94 s from report to repair
// opened when all went at PriorityBackground).
func (r *Reconciler) catchUp(ctx context.Context, passStart time.Time) {
	r.mu.Lock()
	since, evidence, gen := r.catchUpFrom, r.catchUpEvidence, r.catchUpGen
	r.mu.Unlock()
	if since.IsZero() {
		since = passStart.Add(-r.cfg.CatchUpLookback)
		if fresh := passStart.Add(-r.cfg.FreshEvidence); evidence.IsZero() || fresh.Before(evidence) {
			evidence = fresh
		}
	}
	refs, err := r.cfg.Store.NodesWithFindingsSince(ctx, since)
	if err != nil {
		r.log.ErrorContext(ctx, "catch up on new findings", "err", err)
		return // the next pass tries again from the same point
	}
	fresh := 0
	for _, n := range refs { // the newest first
		if !r.Serves(n.Cluster) || !r.leads(n.Cluster) {
			continue
		}
		p := PriorityBackground
		if !evidence.IsZero() && !n.Newest.Before(evidence) {
			p = PriorityEvidence
			fresh++
		}
		r.add(nodeKey{n.Cluster, n.Node}, p)
	}
	if !evidence.IsZero() {
		r.log.InfoContext(ctx, "caught up after a restart, a new Lease or a listener gap", "nodes", len(refs),
			"evidence_priority", fresh, "since", since, "evidence_since", evidence)
	}
	r.mu.Lock()
	if r.catchUpGen == gen { // no reset meanwhile
		r.catchUpFrom = passStart.Add(-catchUpMargin)
		r.catchUpEvidence = time.Time{}
	}
	r.mu.Unlock()
}

// resetCatchUp makes the next catch-up start at from at the latest (zero:
// CatchUpLookback back) and queue the nodes whose newest finding is at or
// after from at PriorityEvidence (zero: FreshEvidence back).
func (r *Reconciler) resetCatchUp(from time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetCatchUpLocked(from)
}

func (r *Reconciler) resetCatchUpLocked(from time.Time) {
	if from.IsZero() || r.catchUpFrom.IsZero() || from.Before(r.catchUpFrom) {
		r.catchUpFrom = from
	}
	// The evidence point only moves back: a zero from leaves an earlier
	// gap's point, and catchUp takes the older of it and FreshEvidence.
	if !from.IsZero() && (r.catchUpEvidence.IsZero() || from.Before(r.catchUpEvidence)) {
		r.catchUpEvidence = from
	}
	r.catchUpGen++
}

// Run starts every cached cluster's informers (their watches enqueue the
// nodes that change), Workers reconcile workers on the work queue, and the
// periodic pass (breaker evaluation, replacement checks, every open repair
// re-enqueued), which runs every Resync, and a breaker evaluation alone
// whenever a new condition diagnosis asks for one (EvaluateSoon), until ctx
// ends.
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
		full := true
		var last time.Time // the last evaluation asked for by EvaluateSoon
		for {
			if full {
				r.enqueueOpen(ctx)
			} else {
				// Requests within evaluateSpacing of the last evaluation
				// wait for its end and coalesce: in a wave every new repair
				// asks, and each evaluation reads the whole fleet.
				if wait := time.Until(last.Add(min(evaluateSpacing, r.cfg.Resync))); wait > 0 {
					select {
					case <-ctx.Done():
						return nil
					case <-time.After(wait):
					}
				}
				last = time.Now()
				r.evaluateSoon(ctx)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				full = true
			case <-r.pass:
				full = true
			case <-r.evaluate:
				full = false
			}
		}
	})
	g.Go(func() error {
		<-ctx.Done()
		r.queue.ShutDown() // workers finish their current item, then return
		r.mu.Lock()
		for k, w := range r.wakes {
			w.timer.Stop()
			delete(r.wakes, k)
		}
		r.mu.Unlock()
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
// A node taken at PriorityEvidence gets the ledger part of its reconcile
// only and is queued again for the rest (PriorityHeld when an open breaker
// holds its repair, else PriorityFollowUp); a repair left tolerating is
// queued for the end of its window at PriorityFollowUp. A failed
// reconcile is retried at its priority with per-node exponential backoff
// (RetryBase doubling up to RetryMax); a node of a cluster whose API server
// was seen unreachable waits for the next pass instead of a worker.
func (r *Reconciler) work(ctx context.Context) bool {
	k, p, shutdown := r.queue.GetWithPriority()
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
		r.queue.AddWithOpts(priorityqueue.AddOpts{After: r.cfg.Resync, Priority: &p}, k) // its nodes are unknown; no worker waits on a dead API server
		return true
	}
	ledgerOnly := p >= PriorityEvidence
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReconcileTimeout)
	out, err := r.reconcile(rctx, k.cluster, k.node, ledgerOnly)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return true // shutting down
		}
		r.reconciles.WithLabelValues("error").Inc()
		r.log.ErrorContext(ctx, "reconcile node", "cluster", k.cluster, "node", k.node, "err", err,
			"retries", r.queue.NumRequeues(k))
		r.queue.AddWithOpts(priorityqueue.AddOpts{RateLimited: true, Priority: &p}, k)
		return true
	}
	r.queue.Forget(k)
	r.reconciles.WithLabelValues("ok").Inc()
	switch {
	case ledgerOnly && out.held:
		r.add(k, PriorityHeld)
	case ledgerOnly:
		r.add(k, PriorityFollowUp)
	case out.wake.After(r.cfg.Now()):
		r.wakeAt(k, out.wake) // a window already over is the guards' now; retried by the periodic pass
	}
	return true
}

// wakeAt queues k at PriorityFollowUp at wake (Config.Now's clock, measured as a
// delay on the real one). It keeps one timer per node, the latest asked:
// not an AddAfter of the queue, which a later trigger of the same node at
// PriorityBackground (a watch, the periodic pass) would make ready at once
// at the higher of the two priorities.
func (r *Reconciler) wakeAt(k nodeKey, wake time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.wakes[k]; ok {
		if w.at.Equal(wake) {
			return
		}
		w.timer.Stop()
	}
	w := &wakeup{at: wake}
	w.timer = time.AfterFunc(max(wake.Sub(r.cfg.Now()), 0), func() {
		r.mu.Lock()
		if r.wakes[k] == w {
			delete(r.wakes, k)
		}
		r.mu.Unlock()
		r.add(k, PriorityFollowUp) // a no-op once the queue shut down
	})
	r.wakes[k] = w
}

// wakeup is a node's pending PriorityFollowUp trigger (wakeAt).
type wakeup struct {
	at    time.Time
	timer *time.Timer
}

// EvaluateSoon asks for a breaker evaluation now (evaluateSoon; the rest
// of the periodic pass keeps its Resync schedule). It never blocks;
// requests coalesce.
func (r *Reconciler) EvaluateSoon() {
	select {
	case r.evaluate <- struct{}{}:
	default:
	}
}

// evaluateSpacing is the least time between two evaluations asked for by
// EvaluateSoon (at most Resync): the first request is served at once, the
// ones after it together a second later. It bounds what a wave costs (each
// evaluation reads every Node and agent row: in a 10,000-node wave they ran
// back to back and took the CPU the repairs needed) and delays a trip by at
// most this; a deletion still needs its toleration to end and a fresh
// evaluation (MaxBreakerAge).
const evaluateSpacing = time.Second

// PassSoon asks for the whole periodic pass now (catch-up on new findings,
// breaker evaluation, replacement checks, open repairs re-queued), as at
// the next Resync. It never blocks; requests coalesce.
func (r *Reconciler) PassSoon() {
	select {
	case r.pass <- struct{}{}:
	default:
	}
}

// evaluateSoon is the pass EvaluateSoon asks for: the breakers evaluated
// on the clusters' current Nodes, then the repairs that waited for a fresh
// evaluation (awaitBreakers) queued at PriorityFollowUp. Not the whole periodic
// pass: in a wave every new repair asks for an evaluation, and re-queueing
// every open repair each time (1,500 in a 10,000-node zone wave) kept the
// workers and PostgreSQL busy with reconciles that change nothing.
func (r *Reconciler) evaluateSoon(ctx context.Context) {
	if err := r.evaluateBreakers(ctx, r.listFleet(ctx)); err != nil {
		r.log.ErrorContext(ctx, "evaluate breakers", "err", err)
		return // the waiting repairs wait for the next evaluation
	}
	r.mu.Lock()
	waiting := r.awaiting
	r.awaiting = nil
	r.mu.Unlock()
	for k := range waiting {
		r.add(k, PriorityFollowUp)
	}
}

// awaitBreakers queues k at PriorityFollowUp after the next breaker evaluation
// (a deletion guard refused a breaker state too old to act on).
func (r *Reconciler) awaitBreakers(k nodeKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.awaiting == nil {
		r.awaiting = map[nodeKey]bool{}
	}
	r.awaiting[k] = true
}

// enqueueOpen triggers every node that has an open repair, so toleration
// windows expire and deletions complete without new findings, and every
// node on which another agent reports a problem condition (interop); it
// marks removed the stored nodes whose Nodes are gone (sweepRemoved).
func (r *Reconciler) enqueueOpen(ctx context.Context) {
	r.catchUp(ctx, r.cfg.Now())
	listedAt := r.cfg.Now()
	fleet := r.listFleet(ctx) // one Node list per cluster for the whole pass
	r.sweepRemoved(ctx, fleet, listedAt)
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
			r.add(nodeKey{rp.Cluster, rp.Node}, PriorityBackground)
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
				r.add(nodeKey{name, n.Name}, PriorityBackground)
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
