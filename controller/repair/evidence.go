package repair

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// The evidence step in groups (docs/design.md "The evidence step in
// groups"). In a zone wave the evidence step (reconcile with ledgerOnly,
// queue.go PriorityEvidence) of 1,500 nodes is two PostgreSQL round trips
// per node, one read (store.ReadNode) and one write transaction
// (store.WriteNodeLedger); on two cores shared with PostgreSQL, the API
// server and the agents it opened repairs at about 450 nodes/s against
// reports arriving at 500/s (issue 9, docs/scale.md). The workers that are
// in the evidence step at the same time therefore share their round
// trips: each worker still takes one node from the work queue (its
// deduplication, per-node lock, priorities and backoff are unchanged) and
// runs the node's reconcile itself, but its read joins the reads waiting
// at that moment in one store.ReadNodes batch, and its ledger write the
// waiting writes in one store.WriteNodeLedgers transaction. A group is
// sent as soon as a sender is free (groupSenders at once); while one is on
// its way the next fills, so the groups grow with the load and a lone
// node waits for nobody. Every decision stays the reconcile's, per node:
// only the round trips are shared, and in them the statements: a group's
// read and its write hold one set-based statement per kind for all its
// nodes (the node upserts, the repairs read, the findings read; the
// diagnosis upserts, deactivations, links, repairs opened), not four to
// six per node (controller/store snapshot.go; docs/design.md "The
// evidence step in groups"). The follow-up's reconcile (the
// Kubernetes writes, ledger steps past Detected) reads and writes its node
// through the same groups.
//
// One node's failure is its own: a read group that fails is read again
// node by node, and WriteNodeLedgers writes a failed group again one node
// per transaction, so a node whose write is refused neither loses nor
// blocks the others' repairs, and each node's repair opens exactly once
// (its own transaction's outcome; repairs_one_open_per_node).

// DefaultEvidenceGroup is the default of Config.EvidenceGroup.
const DefaultEvidenceGroup = 64

// groupSenders is how many groups of one kind (reads, writes) are on
// their way to PostgreSQL at once: two keep the database busy while the
// next group fills (BenchmarkWaveLedgerStep, 16 workers: PostgreSQL CPU
// per node 0.97 ms with one sender, 0.99 ms with two, 2.0 ms with four;
// 2.1 ms alone).
const groupSenders = 2

// ledgerDB is the database part of a reconcile: the store itself, or the
// evidence step's groups (evidenceGroups).
type ledgerDB interface {
	ReadNode(ctx context.Context, meta store.Node, findingsLimit int, now time.Time) (store.NodeSnapshot, error)
	WriteNodeLedger(ctx context.Context, w store.NodeLedger, now time.Time) (store.NodeLedgerResult, error)
}

// evidenceGroups is the ledgerDB of the evidence step: concurrent calls
// share a round trip (group).
type evidenceGroups struct {
	reads  *group[nodeRead, store.NodeSnapshot]
	writes *group[store.NodeLedger, store.NodeLedgerResult]
}

// nodeRead is one ReadNode call.
type nodeRead struct {
	meta  store.Node
	limit int
}

// newEvidenceGroups groups st's node reads and ledger writes, at most max
// nodes a group.
func newEvidenceGroups(st *store.Store, max int) *evidenceGroups {
	return &evidenceGroups{
		reads: newGroup(max, func(ctx context.Context, qs []nodeRead, now time.Time) ([]store.NodeSnapshot, []error) {
			out, errs := make([]store.NodeSnapshot, len(qs)), make([]error, len(qs))
			if len(qs) > 1 && qs[0].limit == qs[len(qs)-1].limit {
				metas := make([]store.Node, len(qs))
				for i, q := range qs {
					metas[i] = q.meta
				}
				snaps, err := st.ReadNodes(ctx, metas, qs[0].limit, now)
				if err == nil {
					return snaps, errs
				}
				if ctx.Err() != nil || errors.Is(err, store.ErrUnavailable) {
					for i := range errs {
						errs[i] = err
					}
					return out, errs
				}
			}
			for i, q := range qs { // alone, or the group failed: each read on its own
				out[i], errs[i] = st.ReadNode(ctx, q.meta, q.limit, now)
			}
			return out, errs
		}),
		writes: newGroup(max, func(ctx context.Context, ws []store.NodeLedger, now time.Time) ([]store.NodeLedgerResult, []error) {
			out, errs := make([]store.NodeLedgerResult, len(ws)), make([]error, len(ws))
			// A node written twice (the work queue never reconciles a node
			// on two workers at once, ReconcileNode's callers may) goes in
			// a later transaction, in the order the writes came.
			for todo := indexes(len(ws)); len(todo) > 0; {
				var round, later []int
				seen := make(map[[2]string]bool, len(todo))
				for _, i := range todo {
					if k := [2]string{ws[i].Cluster, ws[i].Node}; seen[k] {
						later = append(later, i)
					} else {
						seen[k] = true
						round = append(round, i)
					}
				}
				part := make([]store.NodeLedger, len(round))
				for j, i := range round {
					part[j] = ws[i]
				}
				res, es := st.WriteNodeLedgers(ctx, part, now)
				for j, i := range round {
					out[i], errs[i] = res[j], es[j]
				}
				todo = later
			}
			return out, errs
		}),
	}
}

// indexes returns 0, 1, ..., n-1.
func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// ReadNode is store.ReadNode, sent with the reads waiting at the time.
func (g *evidenceGroups) ReadNode(ctx context.Context, meta store.Node, findingsLimit int, now time.Time) (store.NodeSnapshot, error) {
	return g.reads.do(ctx, nodeRead{meta, findingsLimit}, now)
}

// WriteNodeLedger is store.WriteNodeLedger, written in one transaction with
// the writes waiting at the time (each with its own outcome).
func (g *evidenceGroups) WriteNodeLedger(ctx context.Context, w store.NodeLedger, now time.Time) (store.NodeLedgerResult, error) {
	return g.writes.do(ctx, w, now)
}

// group gathers the calls of concurrent callers and sends them together:
// up to groupSenders senders each take every call waiting (at most max)
// and run send on them, until none is left. send gets the calls in arrival
// order and returns one answer and one error per call; its context is the
// first call's and its clock the first call's now (the callers of one
// group are at most one send apart).
type group[Q, A any] struct {
	max  int
	send func(ctx context.Context, qs []Q, now time.Time) ([]A, []error)

	mu      sync.Mutex
	waiting []*call[Q, A]
	senders int
	// sent counts the groups sent and calls the calls they held.
	sent, calls atomic.Int64
}

// call is one caller's request in a group and, once done is closed, its
// answer.
type call[Q, A any] struct {
	ctx  context.Context
	q    Q
	now  time.Time
	a    A
	err  error
	done chan struct{}
}

func newGroup[Q, A any](max int, send func(ctx context.Context, qs []Q, now time.Time) ([]A, []error)) *group[Q, A] {
	return &group[Q, A]{max: max, send: send}
}

// do queues q and waits for its answer. It always waits for the group it
// joined to be sent, so a caller never returns while its write may still
// commit; a canceled ctx cancels the send of the group it leads.
func (g *group[Q, A]) do(ctx context.Context, q Q, now time.Time) (A, error) {
	c := &call[Q, A]{ctx: ctx, q: q, now: now, done: make(chan struct{})}
	g.mu.Lock()
	g.waiting = append(g.waiting, c)
	start := g.senders < groupSenders
	if start {
		g.senders++
	}
	g.mu.Unlock()
	if start {
		go g.sendAll()
	}
	<-c.done
	return c.a, c.err
}

// sendAll sends the waiting calls a group at a time until none waits.
func (g *group[Q, A]) sendAll() {
	for {
		g.mu.Lock()
		if len(g.waiting) == 0 {
			g.senders--
			g.mu.Unlock()
			return
		}
		n := min(len(g.waiting), g.max)
		batch := g.waiting[:n:n]
		g.waiting = append([]*call[Q, A](nil), g.waiting[n:]...)
		g.mu.Unlock()
		qs := make([]Q, n)
		for i, c := range batch {
			qs[i] = c.q
		}
		g.sent.Add(1)
		g.calls.Add(int64(n))
		as, errs := g.send(batch[0].ctx, qs, batch[0].now)
		for i, c := range batch {
			c.a, c.err = as[i], errs[i]
			close(c.done)
		}
	}
}
