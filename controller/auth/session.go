package auth

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/alexedwards/scs/v2"
)

// Sessions are the dashboard's login sessions: a cookie holding a random
// token, the data server-side in store (PostgreSQL in production, so every
// replica sees a login and a logout at once), an absolute lifetime and an
// idle timeout. The library is github.com/alexedwards/scs/v2.
type Sessions struct{ m *scs.SessionManager }

// SessionCookie is the name of the session cookie.
const SessionCookie = "fleetrepair_session"

// NewSessions returns sessions kept in store that end lifetime after login
// or idle after the last request. secure marks the cookie HTTPS-only (set
// it whenever the dashboard is served over TLS).
func NewSessions(store scs.Store, lifetime, idle time.Duration, secure bool) *Sessions {
	m := scs.New()
	m.Store = store
	m.Lifetime, m.IdleTimeout = lifetime, idle
	m.Cookie.Name = SessionCookie
	m.Cookie.HttpOnly = true
	m.Cookie.SameSite = http.SameSiteLaxMode
	m.Cookie.Secure = secure
	m.Cookie.Path = "/"
	return &Sessions{m: m}
}

// Middleware loads the session of each request and saves it after, and puts
// a logged-in human in the request's context (WithOperator).
func (s *Sessions) Middleware(next http.Handler) http.Handler {
	return s.m.LoadAndSave(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if op, ok := s.Operator(r.Context()); ok {
			r = r.WithContext(WithOperator(r.Context(), op))
		}
		next.ServeHTTP(w, r)
	}))
}

// Login makes the session of ctx a login of op, under a new token (no
// session fixation).
func (s *Sessions) Login(ctx context.Context, op Operator) error {
	if err := s.m.RenewToken(ctx); err != nil {
		return fmt.Errorf("renew session token: %w", err)
	}
	s.m.Put(ctx, "operator", op.Name)
	s.m.Put(ctx, "role", string(op.Role))
	return nil
}

// Logout ends the session of ctx (its row is deleted).
func (s *Sessions) Logout(ctx context.Context) error {
	if err := s.m.Destroy(ctx); err != nil {
		return fmt.Errorf("end session: %w", err)
	}
	return nil
}

// Operator returns the human logged in on the session of ctx.
func (s *Sessions) Operator(ctx context.Context) (Operator, bool) {
	name, role := s.m.GetString(ctx, "operator"), Role(s.m.GetString(ctx, "role"))
	if name == "" || role.rank() < 0 {
		return Operator{}, false
	}
	return Operator{Name: name, Role: role}, true
}

// Put keeps a value in the session (the login's state, nonce, PKCE verifier).
func (s *Sessions) Put(ctx context.Context, key, value string) { s.m.Put(ctx, key, value) }

// Pop returns a value kept by Put and removes it ("" when absent).
func (s *Sessions) Pop(ctx context.Context, key string) string { return s.m.PopString(ctx, key) }
