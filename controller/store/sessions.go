package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sessions persists dashboard login sessions for the session library
// (github.com/alexedwards/scs/v2: it implements scs.CtxStore). Rows past
// their expiry are never returned and are deleted by DeleteExpiredSessions.
type Sessions struct {
	s   *Store
	now func() time.Time
}

// Sessions returns the session store of the database; now is the clock
// (nil: time.Now).
func (s *Store) Sessions(now func() time.Time) *Sessions {
	if now == nil {
		now = time.Now
	}
	return &Sessions{s: s, now: now}
}

// FindCtx returns the data of an unexpired session; found is false when
// there is none.
func (ss *Sessions) FindCtx(ctx context.Context, token string) (b []byte, found bool, err error) {
	err = ss.s.pool.QueryRow(ctx, `SELECT data FROM sessions WHERE token = $1 AND expiry > $2`, token, ss.now()).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, errorf(err, "find session")
	}
	return b, true, nil
}

// CommitCtx stores a session's data until expiry.
func (ss *Sessions) CommitCtx(ctx context.Context, token string, b []byte, expiry time.Time) error {
	_, err := ss.s.pool.Exec(ctx, `INSERT INTO sessions (token, data, expiry) VALUES ($1, $2, $3)
ON CONFLICT (token) DO UPDATE SET data = excluded.data, expiry = excluded.expiry`, token, b, expiry)
	if err != nil {
		return errorf(err, "commit session")
	}
	return nil
}

// DeleteCtx removes a session (logout).
func (ss *Sessions) DeleteCtx(ctx context.Context, token string) error {
	if _, err := ss.s.pool.Exec(ctx, `DELETE FROM sessions WHERE token = $1`, token); err != nil {
		return errorf(err, "delete session")
	}
	return nil
}

// Find, Commit and Delete are the context-free scs.Store methods; the
// library calls the Ctx ones when present.
func (ss *Sessions) Find(token string) ([]byte, bool, error) {
	return ss.FindCtx(context.Background(), token)
}

// Commit implements scs.Store.
func (ss *Sessions) Commit(token string, b []byte, expiry time.Time) error {
	return ss.CommitCtx(context.Background(), token, b, expiry)
}

// Delete implements scs.Store.
func (ss *Sessions) Delete(token string) error { return ss.DeleteCtx(context.Background(), token) }

// DeleteExpiredSessions deletes sessions expired before now and returns how many.
func (s *Store) DeleteExpiredSessions(ctx context.Context, now time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM sessions WHERE expiry <= $1`, now)
	if err != nil {
		return 0, errorf(err, "delete expired sessions")
	}
	return tag.RowsAffected(), nil
}
