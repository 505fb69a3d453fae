-- 00007_events: the live feed (GET /api/v1/events, docs/design.md "Live
-- events"). Triggers append one row per repair transition (repair_audit),
-- per diagnosis that appears, (de)activates or changes severity or action
-- (diagnoses), per breaker decision (breaker_decisions), and per node whose
-- stored health flips between failing (an active condition-severity
-- diagnosis) and ok (none), in the transaction of the change: an event
-- exists exactly when its change committed, whichever code path or replica
-- wrote it. A statement-level trigger NOTIFYs fleetrepair_events (no payload:
-- readers fetch by id), once per transaction (PostgreSQL folds identical
-- notifications).
--
-- id is the SSE event id (Last-Event-ID); xid is the writing transaction,
-- which lets a reader tell an id still being committed from one rolled back
-- (controller/feed). at is the source row's time (the controller's clock,
-- never now()); retention deletes by at (store.DeleteEventsBefore).

-- +goose Up
CREATE TABLE events (
    id      bigserial   PRIMARY KEY,
    at      timestamptz NOT NULL,
    type    text        NOT NULL CHECK (type IN ('repair', 'diagnosis', 'breaker', 'node')),
    cluster text        NOT NULL DEFAULT '',
    node    text        NOT NULL DEFAULT '',
    data    jsonb       NOT NULL,
    xid     xid8        NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX events_at_idx ON events (at);

-- +goose StatementBegin
CREATE FUNCTION fleetrepair_event_repair() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r repairs%ROWTYPE;
BEGIN
    SELECT * INTO r FROM repairs WHERE id = NEW.repair_id;
    INSERT INTO events (at, type, cluster, node, data) VALUES (NEW.at, 'repair', r.cluster, r.node, jsonb_build_object(
        'repairId', NEW.repair_id, 'auditId', NEW.id, 'cluster', r.cluster, 'node', r.node,
        'nodepool', r.nodepool, 'reason', r.reason, 'from', COALESCE(NEW.from_state, ''), 'to', NEW.to_state,
        'actor', NEW.actor, 'why', NEW.reason, 'dryRun', r.dry_run, 'at', NEW.at));
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER repair_audit_event AFTER INSERT ON repair_audit
    FOR EACH ROW EXECUTE FUNCTION fleetrepair_event_repair();

-- +goose StatementBegin
CREATE FUNCTION fleetrepair_event_diagnosis() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    others boolean;
    before boolean;
    after  boolean;
BEGIN
    -- A re-diagnosis that only moves last_seen or adds findings is no news.
    IF TG_OP = 'UPDATE' AND OLD.active = NEW.active AND OLD.severity = NEW.severity AND OLD.action = NEW.action THEN
        RETURN NULL;
    END IF;
    INSERT INTO events (at, type, cluster, node, data) VALUES (NEW.updated_at, 'diagnosis', NEW.cluster, NEW.node, jsonb_build_object(
        'id', NEW.id, 'cluster', NEW.cluster, 'node', NEW.node, 'bootId', NEW.boot_id, 'reason', NEW.reason,
        'severity', NEW.severity, 'faultClass', NEW.fault_class, 'action', NEW.action, 'active', NEW.active,
        'created', TG_OP = 'INSERT', 'firstSeen', NEW.first_seen, 'lastSeen', NEW.last_seen, 'at', NEW.updated_at));
    IF NEW.severity = 'condition' OR (TG_OP = 'UPDATE' AND OLD.severity = 'condition') THEN
        others := EXISTS (SELECT 1 FROM diagnoses d WHERE d.cluster = NEW.cluster AND d.node = NEW.node
                          AND d.active AND d.severity = 'condition' AND d.id <> NEW.id);
        before := others OR (TG_OP = 'UPDATE' AND OLD.active AND OLD.severity = 'condition');
        after := others OR (NEW.active AND NEW.severity = 'condition');
        IF before <> after THEN
            INSERT INTO events (at, type, cluster, node, data) VALUES (NEW.updated_at, 'node', NEW.cluster, NEW.node, jsonb_build_object(
                'cluster', NEW.cluster, 'node', NEW.node, 'health', CASE WHEN after THEN 'failing' ELSE 'ok' END,
                'reason', NEW.reason, 'at', NEW.updated_at));
        END IF;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER diagnoses_event AFTER INSERT OR UPDATE ON diagnoses
    FOR EACH ROW EXECUTE FUNCTION fleetrepair_event_diagnosis();

-- +goose StatementBegin
CREATE FUNCTION fleetrepair_event_breaker() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (at, type, data) VALUES (NEW.at, 'breaker', jsonb_build_object(
        'id', NEW.id, 'scope', NEW.scope, 'cohort', NEW.cohort, 'from', NEW.from_phase, 'to', NEW.to_phase,
        'cause', NEW.cause, 'actor', NEW.actor, 'message', NEW.message, 'haltRollout', NEW.halt_rollout,
        'evidence', NEW.evidence, 'at', NEW.at));
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER breaker_decisions_event AFTER INSERT ON breaker_decisions
    FOR EACH ROW EXECUTE FUNCTION fleetrepair_event_breaker();

-- +goose StatementBegin
CREATE FUNCTION fleetrepair_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fleetrepair_events', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER events_notify AFTER INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION fleetrepair_events_notify();

-- +goose Down
DROP TRIGGER breaker_decisions_event ON breaker_decisions;
DROP TRIGGER diagnoses_event ON diagnoses;
DROP TRIGGER repair_audit_event ON repair_audit;
DROP TABLE events;
DROP FUNCTION fleetrepair_events_notify();
DROP FUNCTION fleetrepair_event_breaker();
DROP FUNCTION fleetrepair_event_diagnosis();
DROP FUNCTION fleetrepair_event_repair();
