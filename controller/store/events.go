package store

import (
	"context"
	"encoding/json"
	"strconv"
	"time"
)

// EventsChannel is the PostgreSQL NOTIFY channel the events table's trigger
// notifies (no payload) after every transaction that appended events
// (migrations/00008_events.sql).
const EventsChannel = "fleetrepair_events"

// Event types: what changed. The triggers of migrations/00008_events.sql
// write them in the transaction of the change.
const (
	EventRepair    = "repair"    // a repair transition (one repair_audit row)
	EventDiagnosis = "diagnosis" // a diagnosis appeared, (de)activated, or changed severity or action
	EventBreaker   = "breaker"   // a breaker decision (trip, resume, kill switch, ...)
	EventNode      = "node"      // a node's stored health flipped: failing (active condition diagnosis) or ok
)

// Event is one row of the events table: ID is durable and increasing (the
// SSE id), At the source row's time, Data the event's JSON object (its
// fields per type in docs/dashboard.md).
type Event struct {
	ID      int64           `json:"id"`
	At      time.Time       `json:"at"`
	Type    string          `json:"type"`
	Cluster string          `json:"cluster,omitempty"`
	Node    string          `json:"node,omitempty"`
	Data    json.RawMessage `json:"data"`
}

// EventBatch is what EventsAfter read, with the transaction horizon of the
// same snapshot: every transaction with an id below XMin has ended, and
// every transaction that had started (taken an id) when the snapshot was
// taken has an id below XMax (PostgreSQL's pg_snapshot_xmin/xmax).
type EventBatch struct {
	Events     []Event
	XMin, XMax uint64
}

// MaxEventsLimit bounds one EventsAfter read.
const MaxEventsLimit = 10000

const sqlEventsAfter = `
WITH snap AS (SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS xmin,
                     pg_snapshot_xmax(pg_current_snapshot())::text AS xmax)
SELECT snap.xmin, snap.xmax, e.id, e.at, e.type, e.cluster, e.node, e.data
FROM snap LEFT JOIN LATERAL (
    SELECT id, at, type, cluster, node, data FROM events WHERE id > $1 ORDER BY id LIMIT $2) e ON true
ORDER BY e.id`

// EventsAfter returns up to limit events with an id above after, oldest
// first (1..MaxEventsLimit; else ErrInvalid), and the snapshot's
// transaction horizon (EventBatch). Ids are allocated before their
// transaction commits, so a committed id may appear after a higher one; a
// reader that skips a missing id must first see XMin pass the XMax of the
// read that found it missing (controller/feed does).
func (s *Store) EventsAfter(ctx context.Context, after int64, limit int) (EventBatch, error) {
	if limit < 1 || limit > MaxEventsLimit {
		return EventBatch{}, invalidf("list events: limit %d is not 1..%d", limit, MaxEventsLimit)
	}
	rows, err := s.pool.Query(ctx, sqlEventsAfter, after, limit)
	if err != nil {
		return EventBatch{}, errorf(err, "list events after %d", after)
	}
	defer rows.Close()
	var b EventBatch
	for rows.Next() {
		var (
			xmin, xmax         string
			id                 *int64
			at                 *time.Time
			typ, cluster, node *string
			data               []byte
		)
		if err := rows.Scan(&xmin, &xmax, &id, &at, &typ, &cluster, &node, &data); err != nil {
			return EventBatch{}, errorf(err, "list events after %d", after)
		}
		if b.XMin, err = strconv.ParseUint(xmin, 10, 64); err != nil {
			return EventBatch{}, errorf(err, "list events: parse snapshot xmin")
		}
		if b.XMax, err = strconv.ParseUint(xmax, 10, 64); err != nil {
			return EventBatch{}, errorf(err, "list events: parse snapshot xmax")
		}
		if id == nil {
			continue // no events: the snapshot row alone
		}
		b.Events = append(b.Events, Event{ID: *id, At: at.UTC(), Type: *typ, Cluster: *cluster, Node: *node, Data: data})
	}
	if err := rows.Err(); err != nil {
		return EventBatch{}, errorf(err, "list events after %d", after)
	}
	return b, nil
}

// EventBounds returns the lowest and highest stored event ids (0, 0 when
// none are stored).
func (s *Store) EventBounds(ctx context.Context) (oldest, newest int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT COALESCE(min(id), 0), COALESCE(max(id), 0) FROM events`).Scan(&oldest, &newest)
	if err != nil {
		return 0, 0, errorf(err, "read event bounds")
	}
	return oldest, newest, nil
}

// DeleteEventsBefore deletes the events older than before (their at) and
// returns how many: the retention of the live feed. Every replica may run
// it; the delete is idempotent.
func (s *Store) DeleteEventsBefore(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM events WHERE at < $1`, before.UTC())
	if err != nil {
		return 0, errorf(err, "delete events before %s", before.Format(time.RFC3339))
	}
	return tag.RowsAffected(), nil
}

// ListenEvents listens on EventsChannel on a dedicated connection and calls
// fn after each notification, until ctx ends (then it returns nil);
// reconnects and callbacks as ListenReconcile. Notifications sent while no
// connection listened are lost: the reader catches up from the table
// (EventsAfter) on connected.
func (s *Store) ListenEvents(ctx context.Context, fn func(), connected func(lostAt time.Time), lost func(error)) error {
	return s.listen(ctx, EventsChannel, func(string) { fn() }, connected, lost)
}
