-- 00002_security_audit: an append-only record of authentication and
-- authorization decisions worth keeping (rejected agent reports, later human
-- logins and approvals), so "who tried to report for node X?" has an answer.

-- +goose Up
CREATE TABLE security_audit (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL,
    cluster     text        NOT NULL DEFAULT '',
    node        text        NOT NULL DEFAULT '',
    -- who: the authenticated subject when known (system:serviceaccount:ns:sa), else ''
    subject     text        NOT NULL DEFAULT '',
    -- what was attempted, e.g. 'ingest'
    action      text        NOT NULL CHECK (action <> ''),
    -- 'denied' (401/403) or 'allowed' (only for actions audited on success)
    outcome     text        NOT NULL CHECK (outcome IN ('allowed', 'denied')),
    -- HTTP status returned and the reason given to the caller
    status      integer     NOT NULL DEFAULT 0,
    reason      text        NOT NULL DEFAULT '',
    remote_addr text        NOT NULL DEFAULT ''
);
CREATE INDEX security_audit_at ON security_audit (at DESC);

-- +goose StatementBegin
CREATE FUNCTION security_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'security_audit is append-only';
END $$;
-- +goose StatementEnd
CREATE TRIGGER security_audit_append_only BEFORE UPDATE OR DELETE ON security_audit
    FOR EACH ROW EXECUTE FUNCTION security_audit_append_only();

-- +goose Down
DROP TABLE security_audit;
DROP FUNCTION security_audit_append_only();
