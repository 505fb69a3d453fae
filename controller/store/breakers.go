package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// BreakerDecision is one stored breaker decision (controller/breaker's
// Decision, kept generic here so the store does not depend on policy code).
type BreakerDecision struct {
	ID          int64
	At          time.Time
	Scope       string
	Cohort      string
	From, To    string
	Cause       string
	Actor       string
	Message     string
	HaltRollout bool
	Evidence    json.RawMessage
}

const (
	sqlGetBreakerState    = `SELECT state, version FROM breaker_state WHERE id = 1`
	sqlInsertBreakerState = `
INSERT INTO breaker_state (id, state, version, updated_at) VALUES (1, $1, 1, $2)
ON CONFLICT (id) DO NOTHING`
	sqlUpdateBreakerState = `
UPDATE breaker_state SET state = $1, version = version + 1, updated_at = $3
WHERE id = 1 AND version = $2`
	sqlInsertBreakerDecision = `
INSERT INTO breaker_decisions (at, scope, cohort, from_phase, to_phase, cause, actor, message, halt_rollout, evidence)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`
	sqlListBreakerDecisions = `
SELECT id, at, scope, cohort, from_phase, to_phase, cause, actor, message, halt_rollout, evidence
FROM breaker_decisions ORDER BY id DESC LIMIT $1`
)

// BreakerState returns the stored breaker state document and its version;
// version 0 and a nil document when none was ever saved.
func (s *Store) BreakerState(ctx context.Context) (json.RawMessage, int64, error) {
	var doc []byte
	var v int64
	err := s.pool.QueryRow(ctx, sqlGetBreakerState).Scan(&doc, &v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, errorf(err, "read breaker state")
	}
	return doc, v, nil
}

// SaveBreakerState replaces the state document if it is still at version
// (0: none saved yet) and appends the decisions, in one transaction. It
// returns ErrConflict when another replica saved first: re-read and
// re-evaluate.
func (s *Store) SaveBreakerState(ctx context.Context, doc json.RawMessage, version int64, ds []BreakerDecision, now time.Time) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var tag interface{ RowsAffected() int64 }
		var err error
		if version == 0 {
			tag, err = tx.Exec(ctx, sqlInsertBreakerState, []byte(doc), now.UTC())
		} else {
			tag, err = tx.Exec(ctx, sqlUpdateBreakerState, []byte(doc), version, now.UTC())
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return &dbError{kind: ErrConflict, err: errors.New("breaker state changed since it was read")}
		}
		for _, d := range ds {
			ev := d.Evidence
			if len(ev) == 0 {
				ev = json.RawMessage("{}")
			}
			if _, err := tx.Exec(ctx, sqlInsertBreakerDecision, d.At.UTC(), d.Scope, d.Cohort, d.From, d.To, d.Cause,
				d.Actor, d.Message, d.HaltRollout, []byte(ev)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return errorf(err, "save breaker state")
	}
	return nil
}

// BreakerDecisions returns the newest limit decisions, newest first.
func (s *Store) BreakerDecisions(ctx context.Context, limit int) ([]BreakerDecision, error) {
	if limit <= 0 || limit > MaxListLimit {
		limit = DefaultListLimit
	}
	rows, _ := s.pool.Query(ctx, sqlListBreakerDecisions, limit)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BreakerDecision, error) {
		var d BreakerDecision
		var ev []byte
		err := r.Scan(&d.ID, &d.At, &d.Scope, &d.Cohort, &d.From, &d.To, &d.Cause, &d.Actor, &d.Message, &d.HaltRollout, &ev)
		d.At, d.Evidence = d.At.UTC(), ev
		return d, err
	})
	if err != nil {
		return nil, errorf(err, "list breaker decisions")
	}
	return out, nil
}
