-- 00003_breakers: the persisted state of the cohort breakers (one JSON
-- document, updated compare-and-set on its version so replicas never
-- overwrite each other) and the append-only log of every breaker decision
-- with its evidence (counts, rates, p-value, window).

-- +goose Up
CREATE TABLE breaker_state (
    id         integer     PRIMARY KEY CHECK (id = 1),
    state      jsonb       NOT NULL,
    version    bigint      NOT NULL CHECK (version >= 1),
    updated_at timestamptz NOT NULL
);

CREATE TABLE breaker_decisions (
    id           bigserial   PRIMARY KEY,
    at           timestamptz NOT NULL,
    scope        text        NOT NULL CHECK (scope <> ''),
    cohort       text        NOT NULL DEFAULT '',
    from_phase   text        NOT NULL,
    to_phase     text        NOT NULL,
    cause        text        NOT NULL,
    actor        text        NOT NULL CHECK (actor <> ''),
    message      text        NOT NULL DEFAULT '',
    halt_rollout boolean     NOT NULL DEFAULT false,
    evidence     jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX breaker_decisions_at ON breaker_decisions (at DESC);

-- +goose StatementBegin
CREATE FUNCTION breaker_decisions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'breaker_decisions is append-only';
END $$;
-- +goose StatementEnd
CREATE TRIGGER breaker_decisions_append_only BEFORE UPDATE OR DELETE ON breaker_decisions
    FOR EACH ROW EXECUTE FUNCTION breaker_decisions_append_only();

-- +goose Down
DROP TABLE breaker_decisions;
DROP FUNCTION breaker_decisions_append_only();
DROP TABLE breaker_state;
