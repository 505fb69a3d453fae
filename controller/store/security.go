package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// SecurityEvent is one authentication or authorization decision.
type SecurityEvent struct {
	ID         int64
	At         time.Time
	Cluster    string
	Node       string
	Subject    string // authenticated identity when known
	Action     string // what was attempted, e.g. "ingest"
	Outcome    string // "allowed" or "denied"
	Status     int    // HTTP status returned
	Reason     string // reason given to the caller
	RemoteAddr string
}

const (
	sqlInsertSecurityEvent = `
INSERT INTO security_audit (at, cluster, node, subject, action, outcome, status, reason, remote_addr)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	sqlListSecurityEvents = `
SELECT id, at, cluster, node, subject, action, outcome, status, reason, remote_addr
FROM security_audit ORDER BY id DESC LIMIT $1`
)

// RecordSecurityEvent appends e (At is set to now). ErrInvalid for an event
// the schema refuses (empty action, unknown outcome).
func (s *Store) RecordSecurityEvent(ctx context.Context, e SecurityEvent, now time.Time) error {
	if _, err := s.pool.Exec(ctx, sqlInsertSecurityEvent, now.UTC(), e.Cluster, e.Node, e.Subject, e.Action,
		e.Outcome, e.Status, e.Reason, e.RemoteAddr); err != nil {
		return errorf(err, "record security event")
	}
	return nil
}

// SecurityEvents returns the newest limit events, newest first.
func (s *Store) SecurityEvents(ctx context.Context, limit int) ([]SecurityEvent, error) {
	if limit <= 0 || limit > MaxListLimit {
		limit = DefaultListLimit
	}
	rows, _ := s.pool.Query(ctx, sqlListSecurityEvents, limit)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SecurityEvent, error) {
		var e SecurityEvent
		err := r.Scan(&e.ID, &e.At, &e.Cluster, &e.Node, &e.Subject, &e.Action, &e.Outcome, &e.Status, &e.Reason, &e.RemoteAddr)
		e.At = e.At.UTC()
		return e, err
	})
	if err != nil {
		return nil, errorf(err, "list security events")
	}
	return out, nil
}
