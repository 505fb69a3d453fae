-- 00005_sessions: dashboard login sessions (DESIGN.md, decision 11), kept
-- server-side so every controller replica sees a login and a logout at once.
-- The row holds the session library's encoded data (alexedwards/scs: the
-- human's name, role and CSRF-free state); the token is the cookie value.

-- +goose Up
CREATE TABLE sessions (
    token  text        PRIMARY KEY,
    data   bytea       NOT NULL,
    expiry timestamptz NOT NULL
);
CREATE INDEX sessions_expiry_idx ON sessions (expiry);

-- +goose Down
DROP TABLE sessions;
