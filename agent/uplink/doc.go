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
//     to Config.RetryMaxInterval).
//   - 401, 403: retried with backoff as well. They describe the agent's
//     credentials, not the batch: kubelet rotates projected ServiceAccount tokens
//     (see Config.TokenFile) and RBAC mistakes get fixed, so dropping the batch
//     would turn a fixable auth problem into lost findings.
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
// # Not yet done: the on-disk spool (issue 3)
//
// The queue lives in memory only. Findings queued or in flight when the agent
// exits are lost; Run counts them on dropped_total{reason="shutdown"} and
// reports them in its error, after one last flush with a short deadline. The
// spool that survives agent restarts is meant to plug in behind the unexported
// queue interface (queue.go): push on Enqueue, take a batch, commit it once the
// controller has answered. A spool keeps a taken batch on disk until commit, so
// a crash mid-send resends it on the next start (at-least-once holds across
// restarts, finding IDs deduplicate). The sender already calls commit; the
// in-memory queue's commit does nothing.
package uplink
