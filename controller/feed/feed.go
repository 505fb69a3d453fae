// Package feed fans the events table (migrations/00008_events.sql: repair
// transitions, diagnoses, breaker decisions, node health flips) out to the
// live streams of one controller replica (GET /api/v1/events).
//
// Every replica runs one Hub. The Hub LISTENs on store.EventsChannel, so a
// change committed by any replica wakes every Hub within a round trip, and
// reads the table in id order; it polls as well (Config.Poll), so a lost
// notification or a dropped listener connection delays events, never loses
// them. Ids are allocated before their transaction commits, so id 11 may be
// visible while id 10 is still being committed: the Hub holds back
// everything after a missing id until the missing id appears or every
// transaction that could still commit it has ended (the snapshot horizon of
// store.EventBatch), so a stream never skips a committed event and never
// delivers one out of order. Config.GapTimeout bounds that wait.
//
// Subscribers get a bounded channel each (Config.Buffer). A subscriber whose
// buffer is full is dropped (its channel closed, Dropped set), never waited
// for: one slow client cannot hold back the Hub or the other streams. A
// dropped client reconnects with its Last-Event-ID and replays what it
// missed (Subscribe).
package feed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Source is what the Hub reads (*store.Store).
type Source interface {
	EventsAfter(ctx context.Context, after int64, limit int) (store.EventBatch, error)
	EventBounds(ctx context.Context) (oldest, newest int64, err error)
	ListenEvents(ctx context.Context, fn func(), connected func(lostAt time.Time), lost func(error)) error
	DeleteEventsBefore(ctx context.Context, before time.Time) (int64, error)
}

// Defaults of Config.
const (
	DefaultBuffer         = 256
	DefaultReplay         = 1000
	DefaultPoll           = time.Second
	DefaultGapTimeout     = 10 * time.Second
	DefaultRetention      = 24 * time.Hour
	DefaultMaxSubscribers = 1000
	// gapPoll is how often the Hub re-reads while it holds back events
	// behind a missing id.
	gapPoll = 25 * time.Millisecond
	// readLimit is the events read at once.
	readLimit = 1000
)

// Config configures a Hub; zero fields take the defaults.
type Config struct {
	Source Source
	// Buffer is each subscriber's channel capacity (events); a subscriber
	// with a full buffer is dropped.
	Buffer int
	// Replay bounds the events a reconnect replays; a client further behind
	// gets a reset (Subscription.Reset) instead.
	Replay int
	// Poll is how often the Hub reads the table without a notification.
	Poll time.Duration
	// GapTimeout bounds how long the Hub holds events back behind a missing
	// id while a transaction older than it is still open (a long-running
	// transaction holds the horizon back); after it the missing id is
	// skipped on the live streams (a replay from the table still has it).
	GapTimeout time.Duration
	// Retention is how long events are kept (pruned every 10 minutes).
	Retention time.Duration
	// MaxSubscribers bounds the streams of this replica at once.
	MaxSubscribers int
	// Registerer receives the feed's metrics (optional):
	// fleetrepair_live_streams (open streams) and
	// fleetrepair_live_streams_dropped_total (streams dropped for falling
	// Buffer events behind).
	Registerer prometheus.Registerer
	Now        func() time.Time
	Log        *slog.Logger
}

// Hub fans events out to subscribers; create it with New, run it with Run.
type Hub struct {
	cfg     Config
	wake    chan struct{}
	streams prometheus.Gauge
	dropped prometheus.Counter

	mu     sync.Mutex
	cursor int64 // every id <= cursor was delivered or skipped
	ready  bool  // Run read the starting cursor
	subs   map[*Subscription]struct{}
	// gap: the missing id cursor+1, the horizon when first missed, since when.
	gapXMax  uint64
	gapSince time.Time
	gapAt    int64
}

// ErrTooMany is Subscribe's error when MaxSubscribers streams are open.
var ErrTooMany = errors.New("too many live streams on this replica")

// ErrNotReady is Subscribe's error before Run read the starting point.
var ErrNotReady = errors.New("live feed not started yet")

// New returns a Hub (Source is required).
func New(cfg Config) (*Hub, error) {
	if cfg.Source == nil {
		return nil, errors.New("new feed: Source is required")
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.Poll, DefaultPoll)
	def(&cfg.GapTimeout, DefaultGapTimeout)
	def(&cfg.Retention, DefaultRetention)
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultBuffer
	}
	if cfg.Replay <= 0 {
		cfg.Replay = DefaultReplay
	}
	if cfg.MaxSubscribers <= 0 {
		cfg.MaxSubscribers = DefaultMaxSubscribers
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	h := &Hub{cfg: cfg, wake: make(chan struct{}, 1), subs: map[*Subscription]struct{}{},
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleetrepair_live_streams", Help: "Live event streams (GET /api/v1/events) open on this replica."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetrepair_live_streams_dropped_total",
			Help: "Live event streams dropped because the client fell behind (it reconnects and replays)."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{h.streams, h.dropped} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register feed metrics: %w", err)
			}
		}
	}
	return h, nil
}

// Subscription is one live stream. Replay holds the events after the
// client's Last-Event-ID up to the Hub's position when it subscribed
// (oldest first); C then carries every later event, and is closed when the
// subscription ends: Close was called, or the client fell Buffer events
// behind (Dropped reports true).
type Subscription struct {
	Replay []store.Event
	// Reset is set when the client's Last-Event-ID is older than the
	// retained events, more than Replay events behind, or past the newest
	// stored event (a restored database): what it missed is not replayed,
	// it must reload its state; ResetReason says why.
	Reset       bool
	ResetReason string
	// Position is the id of the Hub when the subscription began: the last
	// event of Replay, or the id a reset client continues from.
	Position int64

	C       <-chan store.Event
	c       chan store.Event
	hub     *Hub
	dropped atomic.Bool
	once    sync.Once
}

// Dropped reports whether the Hub dropped the subscriber for falling behind.
func (s *Subscription) Dropped() bool { return s.dropped.Load() }

// Close ends the subscription (idempotent).
func (s *Subscription) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.hub.remove(s)
}

// remove unregisters s and closes its channel; h.mu is held.
func (h *Hub) remove(s *Subscription) {
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	h.streams.Dec()
	s.once.Do(func() { close(s.c) })
}

// Subscribe starts a stream. With resume set, the events after lastID are
// replayed (at most Config.Replay; beyond that, when lastID is older
// than the retained events, or when it is past the newest stored event,
// the subscription is a Reset); without it the stream starts now. Errors: ErrNotReady, ErrTooMany, or the Source's.
func (h *Hub) Subscribe(ctx context.Context, lastID int64, resume bool) (*Subscription, error) {
	s := &Subscription{hub: h, c: make(chan store.Event, h.cfg.Buffer)}
	s.C = s.c
	h.mu.Lock()
	if !h.ready {
		h.mu.Unlock()
		return nil, ErrNotReady
	}
	if len(h.subs) >= h.cfg.MaxSubscribers {
		h.mu.Unlock()
		return nil, ErrTooMany
	}
	h.subs[s] = struct{}{}
	h.streams.Inc()
	s.Position = h.cursor
	h.mu.Unlock()
	if !resume || lastID == s.Position {
		return s, nil // live from here
	}
	if lastID > s.Position {
		// Ahead of this replica's feed: another replica's feed may have
		// read newer events (then the stream skips what the client has),
		// but an id past every stored event is from another database (a
		// restore, a rebuilt one): the client would wait for ids that are
		// never written. It restarts from here instead.
		_, newest, err := h.cfg.Source.EventBounds(ctx)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("subscribe: %w", err)
		}
		if lastID > newest {
			s.Reset, s.ResetReason = true, fmt.Sprintf("event %d is ahead of the newest stored event %d (the database was restored or replaced): the stream restarted from %d", lastID, newest, s.Position)
		}
		return s, nil
	}
	if err := h.replay(ctx, s, lastID); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (h *Hub) replay(ctx context.Context, s *Subscription, lastID int64) error {
	oldest, _, err := h.cfg.Source.EventBounds(ctx)
	if err != nil {
		return fmt.Errorf("replay events: %w", err)
	}
	if oldest == 0 || lastID < oldest-1 {
		s.Reset, s.ResetReason = true, fmt.Sprintf("event %d is no longer kept (events are kept %s; the oldest is %d)", lastID, h.cfg.Retention, oldest)
		return nil
	}
	if s.Position-lastID > int64(h.cfg.Replay) {
		s.Reset, s.ResetReason = true, fmt.Sprintf("%d events were missed since %d, more than the %d replayed", s.Position-lastID, lastID, h.cfg.Replay)
		return nil
	}
	for after := lastID; after < s.Position; {
		b, err := h.cfg.Source.EventsAfter(ctx, after, readLimit)
		if err != nil {
			return fmt.Errorf("replay events: %w", err)
		}
		if len(b.Events) == 0 {
			break
		}
		for _, e := range b.Events {
			if e.ID > s.Position {
				return nil
			}
			s.Replay = append(s.Replay, e)
			after = e.ID
		}
	}
	return nil
}

// Run reads and fans out events until ctx ends (then nil): it starts after
// the newest stored event, listens for notifications, polls every Poll and
// prunes events past Retention every 10 minutes. Errors of the Source are
// logged and retried.
func (h *Hub) Run(ctx context.Context) error {
	for {
		_, newest, err := h.cfg.Source.EventBounds(ctx)
		if err == nil {
			h.mu.Lock()
			h.cursor, h.ready = newest, true
			h.mu.Unlock()
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		h.cfg.Log.WarnContext(ctx, "live feed: read the newest event, retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(h.cfg.Poll):
		}
	}
	defer h.closeAll()
	go func() {
		_ = h.cfg.Source.ListenEvents(ctx, h.Wake, func(time.Time) { h.Wake() }, func(err error) {
			h.cfg.Log.WarnContext(ctx, "live feed: listener lost, reconnecting (polling meanwhile)", "err", err)
		})
	}()
	poll := time.NewTicker(h.cfg.Poll)
	defer poll.Stop()
	prune := time.NewTicker(10 * time.Minute)
	defer prune.Stop()
	h.pruneOnce(ctx)
	for {
		held := h.pull(ctx)
		var again <-chan time.Time
		if held {
			again = time.After(gapPoll)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-h.wake:
		case <-poll.C:
		case <-again:
		case <-prune.C:
			h.pruneOnce(ctx)
		}
	}
}

// Wake makes Run read the table now (the listener calls it; so may a
// writer in this process that wants its event out at once).
func (h *Hub) Wake() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

func (h *Hub) pruneOnce(ctx context.Context) {
	n, err := h.cfg.Source.DeleteEventsBefore(ctx, h.cfg.Now().Add(-h.cfg.Retention))
	switch {
	case err != nil && ctx.Err() == nil:
		h.cfg.Log.WarnContext(ctx, "live feed: prune events", "err", err)
	case n > 0:
		h.cfg.Log.InfoContext(ctx, "live feed: pruned events past retention", "deleted", n, "retention", h.cfg.Retention)
	}
}

// pull reads the events after the cursor and delivers them in id order. It
// reports whether it holds events back behind a missing id.
func (h *Hub) pull(ctx context.Context) (held bool) {
	for {
		h.mu.Lock()
		after := h.cursor
		h.mu.Unlock()
		b, err := h.cfg.Source.EventsAfter(ctx, after, readLimit)
		if err != nil {
			if ctx.Err() == nil {
				h.cfg.Log.WarnContext(ctx, "live feed: read events", "err", err)
			}
			return false
		}
		held = h.deliver(b)
		if held || len(b.Events) < readLimit {
			return held
		}
	}
}

// deliver fans out the events of b that follow the cursor without a gap;
// at a missing id it stops, unless the id can no longer commit (every
// transaction that was open when it was first missed has ended) or
// GapTimeout passed. It reports whether events are held back.
func (h *Hub) deliver(b store.EventBatch) (held bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range b.Events {
		if e.ID <= h.cursor {
			continue
		}
		if e.ID != h.cursor+1 {
			if h.gapAt != h.cursor+1 {
				h.gapAt, h.gapXMax, h.gapSince = h.cursor+1, b.XMax, h.cfg.Now()
			}
			settled := b.XMin >= h.gapXMax
			if !settled && h.cfg.Now().Sub(h.gapSince) < h.cfg.GapTimeout {
				return true
			}
			if !settled {
				h.cfg.Log.Warn("live feed: skipping event ids still uncommitted after the gap timeout",
					"from", h.cursor+1, "to", e.ID-1, "timeout", h.cfg.GapTimeout)
			}
		}
		h.gapAt = 0
		h.cursor = e.ID
		for s := range h.subs {
			select {
			case s.c <- e:
			default:
				s.dropped.Store(true)
				h.dropped.Inc()
				h.remove(s)
			}
		}
	}
	return false
}

func (h *Hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ready = false
	for s := range h.subs {
		h.remove(s)
	}
}

// Position returns the id of the last event the Hub fanned out (a page
// rendered now continues after it: GET /api/v1/events?after=ID), and
// whether Run has started.
func (h *Hub) Position() (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cursor, h.ready
}

// Subscribers returns the number of open streams.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}
