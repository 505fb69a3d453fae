// Package uplink carries the agent's findings and heartbeats to the controller:
// a bounded in-memory queue that never blocks the reader feeding it, batched
// HTTPS reports, retries with exponential backoff and jitter, and a counted
// drop for every finding that does not make it.
//
// # Delivery
//
// Delivery is at least once. A batch taken from the queue is retried, unchanged
// (same finding IDs, which the controller uses as idempotency keys), until the
// controller accepts it, rejects it as malformed, or Run's context ends. There
// is no maximum elapsed time: a controller outage never by itself drops a
// finding. While the sender retries, new findings keep queueing in the bounded
// queue, and when it is full the oldest non-critical finding is dropped first.
//
// Outcomes of one POST to URL+"/api/v1/reports":
//
//   - 2xx: delivered.
//   - network error, 5xx, 408, 429: retried with backoff (Retry-After honoured up
//     to Config.RetryMaxInterval, plus up to a quarter of it at random so a
//     fleet turned away together does not return together). The controller
//     answers 429 when too many reports are in flight and 503 when its
//     database is down or slow; the agent keeps queueing (and spooling)
//     meanwhile, and a finding leaves the queue only once a 2xx answered it.
//   - 401, 403: retried with backoff as well. They describe the agent's
//     credentials, not the batch: kubelet rotates projected ServiceAccount tokens
//     (see Config.TokenFile) and RBAC mistakes get fixed, so dropping the batch
//     would turn a fixable auth problem into lost findings.
//   - 413: the report is over the controller's body limit; the batch is split
//     in halves, each sent on its own (and split again if need be), so only
//     a single finding too large by itself is dropped as rejected. While a
//     part waits, the spool keeps every part not delivered yet.
//   - any other 4xx: the controller rejected the batch as malformed; its message
//     is logged once, the report is counted on rejected_total, its findings on
//     dropped_total{reason="rejected"}, and the batch is dropped (retrying would
//     never succeed).
//
// Findings are validated locally with finding.Report.Validate before they are
// sent, so one malformed finding (a detector bug) is dropped on its own
// (dropped_total{reason="invalid"}) instead of taking the whole batch, and the
// critical findings in it, down with it.
//
// # Scheduling
//
// One sender goroutine (Run) sends a report when any of these holds:
//
//   - a critical finding is queued (Config.Critical): at once;
//   - BatchSize findings are queued: at once;
//   - a non-critical finding or a changed heartbeat has waited for the node's
//     next flush point: at most FlushInterval;
//   - HeartbeatInterval is about to pass since the last report.
//
// Flush points form a per-node grid: start + phase + k*FlushInterval, where the
// phase is a hash of the cluster and node name plus a little random jitter. A
// DaemonSet rolled out to a whole cluster therefore does not send in lockstep,
// and heartbeats (also on the grid) stay spread out too. The sender sleeps when
// there is nothing to do: an idle agent wakes about once per HeartbeatInterval.
//
// # Spool (Config.SpoolDir)
//
// Without a spool the queue lives in memory only: what is queued or in flight
// when the agent exits, and the last flush (ShutdownTimeout) cannot deliver,
// is counted on dropped_total{reason="shutdown"} and reported in Run's error.
//
// With a spool, the uplink keeps an on-disk snapshot of the batch in flight
// and the queue (one JSON-lines file, replaced atomically, at most
// SpoolMaxBytes) and loads it back in New, so the findings are resent after
// a restart with the same IDs (the controller deduplicates them). The
// snapshot is written only when it matters, so a healthy agent does no disk
// I/O for it:
//
//   - after every failed attempt, when the queue changed since the last save;
//   - at shutdown, for whatever the last flush could not deliver;
//   - removed once everything in it has been answered.
//
// What the spool does not cover (the rest of issue 3): it is not
// write-through. A crash (SIGKILL, OOM, kernel panic) loses what arrived since
// the last snapshot: up to one retry wait (RetryMaxInterval) of findings
// while the controller is unreachable, up to FlushInterval of not-yet-sent
// findings while it is healthy. Writing every finding as it is enqueued would
// close that gap at the cost of disk I/O on the kernel-log path; it would go
// behind memQueue.push, off the caller's goroutine.
package uplink
