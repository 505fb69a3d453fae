package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/feed"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Stream timing of GET /api/v1/events.
const (
	// StreamKeepAlive is how often an idle stream gets a comment line, so
	// proxies keep it open and a vanished client is noticed.
	StreamKeepAlive = 15 * time.Second
	// StreamMaxAge ends a stream after this long; the client reconnects
	// with its Last-Event-ID (EventSource does by itself) and is
	// authenticated again, so a revoked token or an ended login session
	// stops receiving within it.
	StreamMaxAge = 10 * time.Minute
	// streamWriteTimeout bounds one write to the client; a client that
	// does not read for this long is dropped.
	streamWriteTimeout = 10 * time.Second
	// streamRetryMS is the reconnect delay the stream asks clients for.
	streamRetryMS = 1000
)

// ResetEvent is the data of the `reset` event: the client's Last-Event-ID
// is too old to replay (Reason says why); it must reload its state (the
// GET routes) and continue from Position, the reset event's id.
type ResetEvent struct {
	Reason   string `json:"reason"`
	Position int64  `json:"position"`
}

// LivePosition returns the live feed's position, the id of its newest
// event (a page rendered now opens GET /api/v1/events?after=ID, so nothing
// between its render and its stream is missed), and false when the
// controller has no feed or it has not started.
func (sv *Service) LivePosition() (int64, bool) {
	if sv.s.cfg.Feed == nil {
		return 0, false
	}
	return sv.s.cfg.Feed.Position()
}

// events serves GET /api/v1/events: a Server-Sent Events stream of the
// live feed (controller/feed), one SSE event per row of the events table:
// `id:` is the event id, `event:` its type (repair, diagnosis, breaker,
// node), `data:` the JSON object {id, at, type, cluster, node, data}
// (store.Event). A Last-Event-ID header (or ?after=ID for a first connect)
// replays what came after that id, at most feed.Config.Replay events; an id
// older than the retention, or further behind, gets one `reset` event
// (ResetEvent) instead. ?types=repair,breaker keeps only those types.
// Needs the viewer role when operators or a login are configured. 503 when
// the controller has no feed; 429 when the replica has too many streams.
func (s *server) events(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Feed == nil {
		writeError(w, http.StatusServiceUnavailable, "live events not available", "this controller was started without the live feed", nil)
		return
	}
	var problems []string
	lastID, resume := int64(0), false
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("after")} {
		if v == "" {
			continue
		}
		id, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || id < 0 {
			problems = append(problems, fmt.Sprintf("Last-Event-ID/after: %q is not an event id", v))
		}
		lastID, resume = id, true
		break
	}
	types := map[string]bool{}
	if v := r.URL.Query().Get("types"); v != "" {
		for _, t := range strings.Split(v, ",") {
			switch t = strings.TrimSpace(t); t {
			case store.EventRepair, store.EventDiagnosis, store.EventBreaker, store.EventNode:
				types[t] = true
			default:
				problems = append(problems, fmt.Sprintf("types: %q is not repair, diagnosis, breaker or node", t))
			}
		}
	}
	if len(problems) > 0 {
		writeError(w, http.StatusBadRequest, "invalid query", "", problems)
		return
	}
	sub, err := s.cfg.Feed.Subscribe(r.Context(), lastID, resume)
	switch {
	case errors.Is(err, feed.ErrTooMany):
		s.tooMany(w, "events", err.Error(), 10*time.Second)
		return
	case errors.Is(err, feed.ErrNotReady):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "live events not ready", err.Error(), nil)
		return
	case err != nil:
		s.writeStoreError(w, r, err)
		return
	}
	defer sub.Close()

	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	var buf bytes.Buffer
	// flush writes buf to the client within streamWriteTimeout.
	flush := func() bool {
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		return err == nil && rc.Flush() == nil
	}
	fmt.Fprintf(&buf, "retry: %d\n: fleetrepair live events from %d\n\n", streamRetryMS, sub.Position)
	sent := lastID
	write := func(e store.Event) {
		if e.ID <= sent && resume {
			return // a client ahead of this replica's feed has it already
		}
		sent = e.ID
		if len(types) > 0 && !types[e.Type] {
			return
		}
		b, err := json.Marshal(e)
		if err != nil {
			s.cfg.Log.ErrorContext(r.Context(), "encode live event", "id", e.ID, "err", err)
			return
		}
		fmt.Fprintf(&buf, "id: %d\nevent: %s\ndata: %s\n\n", e.ID, e.Type, b)
	}
	if sub.Reset {
		b, _ := json.Marshal(ResetEvent{Reason: sub.ResetReason, Position: sub.Position})
		fmt.Fprintf(&buf, "id: %d\nevent: reset\ndata: %s\n\n", sub.Position, b)
		sent, resume = sub.Position, true
	}
	for _, e := range sub.Replay {
		write(e)
		if buf.Len() > 64<<10 && !flush() {
			return
		}
	}
	if !flush() {
		return
	}
	keep := time.NewTicker(StreamKeepAlive)
	defer keep.Stop()
	end := time.NewTimer(StreamMaxAge)
	defer end.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-keep.C:
			buf.WriteString(": keep-alive\n\n")
		case e, ok := <-sub.C:
			if !ok {
				if sub.Dropped() {
					s.cfg.Log.InfoContext(r.Context(), "live events: dropped a stream that fell behind", "remote", r.RemoteAddr, "position", sent)
				}
				return
			}
			write(e)
			// Take what else is queued, one write for the lot.
			for more := true; more && buf.Len() < 64<<10; {
				select {
				case e, ok := <-sub.C:
					if !ok {
						more = false
						break
					}
					write(e)
				default:
					more = false
				}
			}
		}
		if buf.Len() > 0 && !flush() {
			return
		}
	}
}
