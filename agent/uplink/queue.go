package uplink

import (
	"sync"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Drop reasons, the values of the "reason" label of
// fleetrepair_agent_uplink_dropped_total. Every finding the uplink gives up
// on while it runs is counted under exactly one of them (a process killed
// outside Run's shutdown counts nothing: that is what the spool is for).
const (
	// DropQueueFull: the queue was full and this was its oldest non-critical finding.
	DropQueueFull = "queue_full"
	// DropQueueFullCritical: the queue was full of critical findings only and
	// this was the oldest.
	DropQueueFullCritical = "queue_full_critical"
	// DropRejected: the controller answered the batch with a 4xx (not 401,
	// 403, 408 or 429).
	DropRejected = "rejected"
	// DropInvalid: the finding failed finding.Report.Validate before sending.
	DropInvalid = "invalid"
	// DropShutdown: still queued or in flight when Run returned, the last
	// flush could not deliver it and there was no room in the spool (or no
	// spool).
	DropShutdown = "shutdown"
	// DropSpoolCorrupt: a line of the spool file could not be read back.
	DropSpoolCorrupt = "spool_corrupt"
)

type pushResult struct {
	dropped  string // a Drop* reason, or "" when nothing was dropped
	n        int    // findings queued after the push
	wasEmpty bool   // the queue was empty before the push
}

type queueState struct {
	n, critical int
	version     uint64 // changes on every push and take: the spool saves only when it moved
	// since is when the queue last went from empty to non-empty; zero when
	// empty. The sender flushes at the first flush point after it.
	since time.Time
}

// entry is a queued finding with its enqueue sequence number, which keeps
// batches in enqueue order across the two lanes.
type entry struct {
	seq uint64
	f   finding.Finding
}

// memQueue holds findings between Enqueue and the sender: two FIFO lanes,
// critical and normal, under one mutex. Enqueue order is kept across the
// lanes by a sequence number.
type memQueue struct {
	limit int
	now   func() time.Time

	mu    sync.Mutex
	seq   uint64 // last sequence number given; also the version of pushes
	crit  ring[entry]
	norm  ring[entry]
	since time.Time
	takes uint64
	// length, when set, follows the number of queued findings: every push
	// and take adds its change under mu (queue_length, summed over the
	// uplinks sharing one Metrics).
	length interface{ Add(float64) }
}

func newMemQueue(limit int, now func() time.Time) *memQueue {
	return &memQueue{limit: limit, now: now}
}

// push adds f without blocking; when the queue is full it first drops a
// finding (the oldest non-critical, else the oldest critical) and says why.
func (q *memQueue) push(f finding.Finding, critical bool) pushResult {
	q.mu.Lock()
	defer q.mu.Unlock()
	var r pushResult
	n := q.crit.len() + q.norm.len()
	if n == 0 {
		r.wasEmpty = true
		q.since = q.now()
	}
	if n >= q.limit {
		if q.norm.len() > 0 {
			q.norm.drop()
			r.dropped = DropQueueFull
		} else {
			q.crit.drop()
			r.dropped = DropQueueFullCritical
		}
	}
	q.seq++
	e := entry{seq: q.seq, f: f}
	if critical {
		q.crit.push(e)
	} else {
		q.norm.push(e)
	}
	r.n = q.crit.len() + q.norm.len()
	if q.length != nil && r.n != n {
		q.length.Add(float64(r.n - n))
	}
	return r
}

// take removes and returns up to max findings: critical ones first, then the
// oldest non-critical ones; the batch is in enqueue order.
func (q *memQueue) take(max int) []finding.Finding {
	q.mu.Lock()
	defer q.mu.Unlock()
	nc := min(max, q.crit.len())
	nn := min(max-nc, q.norm.len())
	if nc+nn == 0 {
		return nil
	}
	q.takes++
	out := make([]finding.Finding, 0, nc+nn)
	for nc > 0 || nn > 0 { // merge the lanes by enqueue order
		if nn == 0 || (nc > 0 && q.crit.peek().seq < q.norm.peek().seq) {
			out = append(out, q.crit.pop().f)
			nc--
		} else {
			out = append(out, q.norm.pop().f)
			nn--
		}
	}
	if q.length != nil {
		q.length.Add(-float64(len(out)))
	}
	q.crit.shrink()
	q.norm.shrink()
	if q.crit.len()+q.norm.len() == 0 {
		q.since = time.Time{}
	}
	return out
}

func (q *memQueue) state() queueState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return queueState{n: q.crit.len() + q.norm.len(), critical: q.crit.len(), since: q.since,
		version: q.seq + q.takes}
}

// snapshot returns a copy of every queued finding, in enqueue order, and the
// queue version it reflects.
func (q *memQueue) snapshot() ([]finding.Finding, uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]finding.Finding, 0, q.crit.len()+q.norm.len())
	i, j := 0, 0
	for i < q.crit.len() || j < q.norm.len() {
		if j == q.norm.len() || (i < q.crit.len() && q.crit.at(i).seq < q.norm.at(j).seq) {
			out = append(out, q.crit.at(i).f)
			i++
		} else {
			out = append(out, q.norm.at(j).f)
			j++
		}
	}
	return out, q.seq + q.takes
}

// ring is a FIFO on a circular buffer whose capacity is a power of two. It
// doubles when full; shrink hands memory back after a burst, so that an idle
// agent does not keep QueueSize findings' worth of buffer.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

const (
	ringMinCap = 16
	// ringKeepCap is the capacity shrink never goes below: about 60 KB of
	// findings, enough for a default batch, so the usual fill-and-take cycle
	// of the sender does not reallocate.
	ringKeepCap = 256
)

func (r *ring[T]) len() int { return r.n }

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		r.resize(max(ringMinCap, 2*len(r.buf)))
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = v
	r.n++
}

// peek returns the oldest element; the ring must not be empty.
func (r *ring[T]) peek() *T { return &r.buf[r.head] }

// at returns the i-th oldest element, 0 <= i < len.
func (r *ring[T]) at(i int) *T { return &r.buf[(r.head+i)&(len(r.buf)-1)] }

// pop removes and returns the oldest element; the ring must not be empty.
func (r *ring[T]) pop() T {
	v := r.buf[r.head]
	r.drop()
	return v
}

// drop removes the oldest element; the ring must not be empty.
func (r *ring[T]) drop() {
	var zero T
	r.buf[r.head] = zero // release the finding's strings and slices
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
}

// shrink halves the buffer, down to ringKeepCap, while it is at most a
// quarter full: after a burst (a controller outage) the memory goes back.
func (r *ring[T]) shrink() {
	c := len(r.buf)
	for c > ringKeepCap && r.n <= c/4 {
		c /= 2
	}
	if c != len(r.buf) {
		r.resize(c)
	}
}

func (r *ring[T]) resize(c int) {
	buf := make([]T, c)
	for i := 0; i < r.n; i++ {
		buf[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
	}
	r.buf, r.head = buf, 0
}
