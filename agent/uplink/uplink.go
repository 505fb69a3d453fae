package uplink

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Uplink queues findings and sends them to the controller. Enqueue and
// SetHeartbeat are safe for concurrent use; Run is the single sender.
type Uplink struct {
	cfg      Config
	endpoint string
	log      *slog.Logger
	q        *memQueue
	spool    *spool // nil without Config.SpoolDir; used by the sender only
	m        *metrics
	spooled  int           // findings this uplink counts on spool_findings; owned by New and then the sender
	wake     chan struct{} // Enqueue/SetHeartbeat -> sender; buffer 1, never blocks
	running  atomic.Bool
	overflow atomic.Bool // the queue dropped since it was last empty (logged once)

	hbMu      sync.Mutex
	hb        *finding.Heartbeat
	hbVersion uint64    // bumped on every change
	hbSent    uint64    // version last answered by the controller
	hbSince   time.Time // when the unsent change was made; zero when none

	// Owned by the sender goroutine (Run).
	grid         grid
	lastExchange time.Time // last report the controller answered; zero before the first
	failing      bool      // the last attempt failed (logged once per outage)
	failingSince time.Time
}

// New validates cfg, applies its defaults and registers the metrics on
// cfg.Registerer (or counts on cfg.Metrics). It starts nothing: call Run.
func New(cfg Config) (*Uplink, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("configure uplink: %w", err)
	}
	u := &Uplink{
		cfg:      cfg,
		endpoint: cfg.URL + ReportsPath,
		log:      cfg.Logger.With("component", "uplink"),
		q:        newMemQueue(cfg.QueueSize, cfg.Clock.Now),
		wake:     make(chan struct{}, 1),
	}
	if cfg.Metrics != nil {
		u.m = cfg.Metrics.m
	} else {
		u.m = newMetrics()
		if cfg.Registerer != nil {
			if err := u.m.register(cfg.Registerer); err != nil {
				return nil, err
			}
		}
	}
	u.q.length = u.m.queueLength
	if cfg.SpoolDir != "" {
		if err := os.MkdirAll(cfg.SpoolDir, 0o700); err != nil {
			return nil, fmt.Errorf("create spool directory: %w", err)
		}
		u.spool = &spool{dir: cfg.SpoolDir, maxBytes: cfg.SpoolMaxBytes, node: cfg.Node}
		u.spool.removeStaleTemps()
		u.loadSpool()
	}
	return u, nil
}

// loadSpool queues the findings a previous run left in the spool. An
// unreadable spool is logged, not fatal: the agent must come up and watch the
// node even when its disk is in trouble. The file stays until its findings
// are delivered, so a crash before that loses nothing.
func (u *Uplink) loadSpool() {
	fs, skipped, err := u.spool.load()
	if err != nil {
		u.log.Error("ignore unreadable spool; it will be replaced", "err", err)
	}
	if skipped > 0 {
		u.m.dropped.WithLabelValues(DropSpoolCorrupt).Add(float64(skipped))
		u.log.Warn("skip unreadable findings in spool", "count", skipped, "path", u.spool.path())
	}
	for _, f := range fs {
		u.Enqueue(f)
	}
	u.spool.version = u.q.state().version
	u.setSpooled(len(fs))
	if len(fs) > 0 {
		u.log.Info("resend findings spooled by the previous run", "count", len(fs), "path", u.spool.path())
	}
}

// setSpooled records that the spool file now holds n findings: it moves
// spool_findings by the change, so a shared Metrics sums its uplinks' spools.
func (u *Uplink) setSpooled(n int) {
	u.m.spooled.Add(float64(n - u.spooled))
	u.spooled = n
}

// checkpoint saves the batch in flight and the queue to the spool after a
// failed attempt, when they changed since the last save: while the
// controller is unreachable, a crash loses at most what arrived during one
// retry wait (at most RetryMaxInterval).
func (u *Uplink) checkpoint(inflight []finding.Finding) {
	if u.spool == nil {
		return
	}
	queued, version := u.q.snapshot()
	if u.spool.onDisk && version == u.spool.version {
		return
	}
	if len(inflight)+len(queued) == 0 && !u.spool.onDisk {
		return
	}
	if _, err := u.saveSpool(append(slices.Clone(inflight), queued...), version); err != nil {
		u.log.Error("save spool", "err", err) // the findings are still queued in memory
	}
}

// saveSpool replaces the spool with fs (removes it when empty) and returns
// how many findings did not fit. A finding without a BootID gets
// Config.BootID first: read back after a reboot, it must not pass for
// evidence from the new boot.
func (u *Uplink) saveSpool(fs []finding.Finding, version uint64) (omitted int, err error) {
	for i := range fs {
		if fs[i].BootID == "" {
			fs[i].BootID = u.cfg.BootID
		}
	}
	omitted, err = u.spool.save(fs, u.cfg.Critical, u.cfg.Clock.Now())
	if err != nil {
		return 0, err
	}
	u.spool.version = version
	u.setSpooled(len(fs) - omitted)
	if omitted > 0 {
		u.log.Warn("spool full, oldest findings left out", "omitted", omitted, "maxBytes", u.cfg.SpoolMaxBytes)
	}
	return omitted, nil
}

// Enqueue queues f for sending and returns at once: it never blocks on the
// network or on the sender, so the kernel-log reader calling it cannot stall.
// When the queue is full it drops the oldest non-critical finding (the oldest
// critical one when all are critical) and counts it on dropped_total. A
// finding without an ID gets finding.NewID before it is sent. f's slices and
// map are kept, not copied: do not modify them afterwards.
func (u *Uplink) Enqueue(f finding.Finding) {
	critical := u.cfg.Critical(f)
	r := u.q.push(f, critical)
	u.m.enqueued.Inc()
	switch r.dropped {
	case "":
	case DropQueueFull:
		u.m.dropQueueFull.Inc()
	case DropQueueFullCritical:
		u.m.dropQueueFullCritical.Inc()
	}
	if r.dropped != "" && !u.overflow.Load() && u.overflow.CompareAndSwap(false, true) {
		u.log.Warn("uplink queue full, dropping oldest findings; see fleetrepair_agent_uplink_dropped_total",
			"queueSize", u.cfg.QueueSize)
	}
	if critical || r.wasEmpty || r.n >= u.cfg.BatchSize {
		u.notify()
	}
}

// SetHeartbeat replaces the heartbeat sent with every report. A changed
// heartbeat is sent at the next flush point (within FlushInterval); an
// unchanged one at least every HeartbeatInterval. A heartbeat that fails
// finding.Report.Validate is logged and ignored: the previous one is kept, so
// a bad monitor state cannot get whole reports rejected.
func (u *Uplink) SetHeartbeat(hb finding.Heartbeat) {
	r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: u.cfg.Cluster, Node: u.cfg.Node, BootID: u.cfg.BootID, Heartbeat: &hb}
	if err := r.Validate(); err != nil {
		u.log.Error("ignore invalid heartbeat", "err", err)
		return
	}
	hb.Monitors = slices.Clone(hb.Monitors)
	u.hbMu.Lock()
	changed := u.hb == nil || !equalHeartbeat(*u.hb, hb)
	if changed {
		u.hb = &hb
		u.hbVersion++
		if u.hbSince.IsZero() {
			u.hbSince = u.cfg.Clock.Now()
		}
	}
	u.hbMu.Unlock()
	if changed {
		u.notify()
	}
}

func equalHeartbeat(a, b finding.Heartbeat) bool {
	return a.DriverVersion == b.DriverVersion && a.KernelVersion == b.KernelVersion &&
		a.GPUCount == b.GPUCount && a.LostRecords == b.LostRecords && slices.Equal(a.Monitors, b.Monitors)
}

func (u *Uplink) notify() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// heartbeat returns the current heartbeat (nil before the first SetHeartbeat)
// and its version.
func (u *Uplink) heartbeat() (*finding.Heartbeat, uint64) {
	u.hbMu.Lock()
	defer u.hbMu.Unlock()
	return u.hb, u.hbVersion
}

// heartbeatAnswered records that the controller answered a report carrying
// heartbeat version v (accepted it, or rejected it: resending would not help).
func (u *Uplink) heartbeatAnswered(v uint64) {
	u.hbMu.Lock()
	defer u.hbMu.Unlock()
	u.hbSent = max(u.hbSent, v)
	if u.hbSent == u.hbVersion {
		u.hbSince = time.Time{}
	}
}

func (u *Uplink) heartbeatChangedSince() time.Time {
	u.hbMu.Lock()
	defer u.hbMu.Unlock()
	return u.hbSince
}

// Run sends reports until ctx ends; it is the uplink's only sender and must
// not be called twice at once. When ctx ends it makes one last attempt, within
// ShutdownTimeout, to deliver the batch in flight and everything queued, keeps
// what it could not deliver in the spool (when configured), then returns. It
// returns nil when no finding was lost, else an error saying how many were
// dropped (counted as dropped_total{reason="shutdown"}).
func (u *Uplink) Run(ctx context.Context) error {
	if !u.running.CompareAndSwap(false, true) {
		return errors.New("run uplink: already running")
	}
	defer u.running.Store(false)

	start := u.cfg.Clock.Now()
	u.grid = grid{origin: start.Add(u.phase()), every: u.cfg.FlushInterval}
	u.lastExchange = time.Time{}
	u.log.Debug("uplink started", "endpoint", u.endpoint, "firstFlush", u.grid.origin.Sub(start))
	for {
		now := u.cfg.Clock.Now()
		next, due := u.nextSend(now)
		if due {
			batch := u.prepare(u.q.take(u.cfg.BatchSize))
			if rest, err := u.deliver(ctx, batch); err != nil {
				return u.shutdown(rest)
			}
			continue
		}
		t := u.cfg.Clock.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return u.shutdown(nil)
		case <-u.wake:
			t.Stop()
		case <-t.C():
		}
	}
}

// nextSend reports whether a report is due at now, and if not, when the next
// one will be (absent new findings).
func (u *Uplink) nextSend(now time.Time) (time.Time, bool) {
	st := u.q.state()
	if st.critical > 0 || st.n >= u.cfg.BatchSize {
		return now, true
	}
	next := u.heartbeatDue()
	if st.n > 0 {
		next = minTime(next, u.grid.next(st.since))
	}
	if since := u.heartbeatChangedSince(); !since.IsZero() {
		next = minTime(next, u.grid.next(since))
	}
	return next, !now.Before(next)
}

// heartbeatDue is when the next heartbeat must go out: at the first flush
// point before the first report, then at the last flush point that keeps the
// gap since the last answered report within HeartbeatInterval.
func (u *Uplink) heartbeatDue() time.Time {
	if u.lastExchange.IsZero() {
		return u.grid.origin
	}
	deadline := u.lastExchange.Add(u.cfg.HeartbeatInterval)
	if t := u.grid.prev(deadline); t.After(u.lastExchange) {
		return t
	}
	return deadline
}

// phase is the delay from Run's start to the node's first flush point: a
// hash of cluster and node name spreads a cluster's agents over one
// FlushInterval deterministically, and up to a tenth of FlushInterval of
// random jitter separates nodes whose hashes happen to collide.
func (u *Uplink) phase() time.Duration {
	every := u.cfg.FlushInterval
	// SHA-256, not FNV: node names differ only in their last characters
	// ("gpu-node-17"), and FNV leaves those in its low bits.
	sum := sha256.Sum256([]byte(u.cfg.Cluster + "\x00" + u.cfg.Node))
	frac := float64(binary.BigEndian.Uint64(sum[:8])) / (1 << 64)
	p := time.Duration(frac*float64(every)) + time.Duration(u.cfg.Rand()*float64(every)/10)
	return p % every
}

// grid is the node's flush points: origin + k*every, k >= 0.
type grid struct {
	origin time.Time
	every  time.Duration
}

// next returns the first flush point at or after t.
func (g grid) next(t time.Time) time.Time {
	if !t.After(g.origin) {
		return g.origin
	}
	k := (t.Sub(g.origin) + g.every - 1) / g.every
	return g.origin.Add(k * g.every)
}

// prev returns the last flush point at or before t, or origin when t is
// before it.
func (g grid) prev(t time.Time) time.Time {
	if !t.After(g.origin) {
		return g.origin
	}
	return g.origin.Add(t.Sub(g.origin) / g.every * g.every)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// prepare gives findings without an ID their finding.NewID and drops, with a
// count and one log line per batch, those that fail validation, so that one
// malformed finding does not get the whole batch rejected.
func (u *Uplink) prepare(batch []finding.Finding) []finding.Finding {
	var (
		invalid  int
		firstErr error
		firstID  string
	)
	out := batch[:0]
	for _, f := range batch {
		if f.ID == "" {
			f.ID = finding.NewID(f)
		}
		r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: u.cfg.Cluster, Node: u.cfg.Node, BootID: u.cfg.BootID,
			Findings: []finding.Finding{f}}
		if err := r.Validate(); err != nil {
			if invalid == 0 {
				firstErr, firstID = err, f.ID
			}
			invalid++
			continue
		}
		out = append(out, f)
	}
	if invalid > 0 {
		clear(batch[len(out):])
		u.m.dropped.WithLabelValues(DropInvalid).Add(float64(invalid))
		u.log.Error("drop invalid findings before sending", "count", invalid, "firstID", firstID, "firstErr", firstErr)
	}
	return out
}

// shutdown makes the last flush after Run's context ended: the batch in
// flight, then the queue, one attempt per report, within ShutdownTimeout.
// What cannot be delivered goes to the spool; what does not fit there (or
// everything, without a spool) is counted as dropped and returned as an error.
func (u *Uplink) shutdown(inflight []finding.Finding) error {
	ctx, cancel := context.WithTimeout(context.Background(), u.cfg.ShutdownTimeout)
	defer cancel()
	batch := inflight
	var later [][]finding.Finding // parts of a split batch still to send
	var err error
	for {
		for len(batch) == 0 {
			if len(later) > 0 {
				batch, later = later[0], later[1:]
				continue
			}
			taken := u.q.take(u.cfg.BatchSize)
			if len(taken) == 0 {
				return nil // all delivered; answered has removed the spool file
			}
			batch = u.prepare(taken)
		}
		hb, hbVersion := u.heartbeat()
		res := u.post(ctx, u.report(batch, hb))
		if res.kind == outcomeRetry {
			err = res.err
			break
		}
		if res.kind == outcomeRejected && res.tooLarge && len(batch) > 1 {
			first, second := splitHalves(batch)
			batch, later = first, append([][]finding.Finding{second}, later...)
			continue
		}
		u.answered(res, batch, hbVersion, len(later) > 0)
		batch = nil
	}
	for _, part := range later {
		batch = append(batch, part...)
	}
	undelivered := batch
	for b := u.q.take(u.cfg.QueueSize); len(b) > 0; b = u.q.take(u.cfg.QueueSize) {
		undelivered = append(undelivered, b...)
	}
	lost := len(undelivered)
	if u.spool != nil {
		omitted, serr := u.saveSpool(undelivered, u.q.state().version)
		if serr == nil && omitted == 0 {
			u.log.Info("controller unreachable at shutdown, findings kept in spool for the next start",
				"count", lost, "err", err)
			return nil
		}
		if serr == nil {
			lost = omitted
		}
		err = errors.Join(err, serr)
	}
	u.m.dropped.WithLabelValues(DropShutdown).Add(float64(lost))
	return fmt.Errorf("flush uplink at shutdown: %d findings not delivered: %w", lost, err)
}
