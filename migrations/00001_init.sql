-- 00001_init: clusters, nodes, findings, diagnoses, the repair ledger and its audit.
--
-- Conventions: every timestamp is timestamptz and is written by the controller
-- from its injected clock (the store's `now` arguments), never by now() in SQL,
-- so tests step a fake clock. Text columns that may be unknown are NOT NULL
-- DEFAULT '' (one spelling for "unknown", no three-valued logic in queries).

-- +goose Up

-- One row per Kubernetes cluster the controller serves. The row doubles as the
-- lock of the cluster's deletion budget (DESIGN.md, decision 7): the guard
-- transaction takes SELECT ... FOR NO KEY UPDATE on it.
CREATE TABLE clusters (
    name                       text        PRIMARY KEY CHECK (name <> ''),
    created_at                 timestamptz NOT NULL,
    -- NodeClaim deletions allowed per sliding hour; 0 stops all deletions.
    deletions_per_hour         integer     NOT NULL DEFAULT 10 CHECK (deletions_per_hour >= 0),
    -- Repairs allowed in state 'deleting' at once per NodePool; 0 stops all deletions.
    max_in_flight_per_nodepool integer     NOT NULL DEFAULT 1 CHECK (max_in_flight_per_nodepool >= 0)
);

-- One row per node ever seen, by its agent (boot_id, heartbeat, versions,
-- last_seen) or by the Kubernetes informers (nodepool, zone, instance_type,
-- nodeclaim). The two writers never touch each other's columns.
CREATE TABLE nodes (
    cluster        text        NOT NULL REFERENCES clusters (name),
    name           text        NOT NULL CHECK (name <> ''),
    -- agent facts
    boot_id        text        NOT NULL DEFAULT '',
    driver_version text        NOT NULL DEFAULT '',
    kernel_version text        NOT NULL DEFAULT '',
    agent_version  text        NOT NULL DEFAULT '',
    heartbeat      jsonb,                 -- the last finding.Heartbeat, NULL until one arrives
    last_seen      timestamptz,           -- when the controller last received a report; NULL: never
    last_sent_at   timestamptz,           -- SentAt of the newest report applied (orders retried reports)
    -- Kubernetes facts
    nodepool       text        NOT NULL DEFAULT '',
    zone           text        NOT NULL DEFAULT '',
    instance_type  text        NOT NULL DEFAULT '',
    nodeclaim      text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    PRIMARY KEY (cluster, name)
);

-- Findings as the agents reported them: append-only (a trigger refuses
-- UPDATE), idempotent by id (the agent's idempotency key, finding.NewID).
--
-- Planned: range partitioning by received_at (daily) with retention by
-- dropping old partitions. A partitioned table's primary key must include the
-- partition key, so id alone can then no longer be unique across partitions;
-- idempotency will be checked against the partitions a retry can reach
-- (received_at within the agent's spool horizon), and no foreign key points at
-- this table for the same reason (repair_findings.finding_id is a soft link).
CREATE TABLE findings (
    -- The agent's idempotency key, unique within a cluster (node names, and
    -- so agent-made IDs, may repeat across clusters).
    id          text        NOT NULL CHECK (length(id) BETWEEN 1 AND 128),
    cluster     text        NOT NULL CHECK (cluster <> ''),
    node        text        NOT NULL CHECK (node <> ''),
    boot_id     text        NOT NULL DEFAULT '',
    detector    text        NOT NULL CHECK (detector <> ''),
    gpu_pci     text        NOT NULL DEFAULT '',
    device_pci  text        NOT NULL DEFAULT '',
    xid         integer     NOT NULL DEFAULT 0 CHECK (xid >= 0),
    count       integer     NOT NULL DEFAULT 1 CHECK (count >= 1),
    attrs       jsonb       NOT NULL DEFAULT '{}',
    evidence    jsonb       NOT NULL DEFAULT '[]',
    seq         bigint      NOT NULL DEFAULT 0 CHECK (seq >= 0),
    observed_at timestamptz,              -- finding.Finding.Time; NULL when the agent could not tell
    received_at timestamptz NOT NULL,     -- when the controller stored it
    PRIMARY KEY (cluster, id)
);
CREATE INDEX findings_node_received_idx ON findings (cluster, node, received_at);

-- Diagnoses: the controller's reading of a node's findings, one row per
-- (node, boot, reason code). Re-diagnosing updates the row; a diagnosis whose
-- evidence is gone is deactivated, not deleted.
CREATE TABLE diagnoses (
    id                bigserial   PRIMARY KEY,
    cluster           text        NOT NULL,
    node              text        NOT NULL,
    boot_id           text        NOT NULL DEFAULT '',
    reason            text        NOT NULL CHECK (reason <> ''),   -- reason code from the catalog
    severity          text        NOT NULL,                        -- condition | event
    fault_class       text        NOT NULL DEFAULT '',
    action            text        NOT NULL DEFAULT '',             -- recommended action
    condition_type    text        NOT NULL DEFAULT '',
    catalog_version   text        NOT NULL DEFAULT '',
    first_seen        timestamptz NOT NULL,
    last_seen         timestamptz NOT NULL,
    finding_ids       text[]      NOT NULL DEFAULT '{}',
    active            boolean     NOT NULL DEFAULT true,
    event_recorded_at timestamptz,        -- when the Kubernetes Event was recorded; NULL: not yet
    detail            jsonb       NOT NULL DEFAULT '{}',           -- message, GPUs, escalation
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    UNIQUE (cluster, node, boot_id, reason)
);
CREATE INDEX diagnoses_active_idx ON diagnoses (cluster, node) WHERE active;

-- The repair ledger (DESIGN.md, decision 6). state follows
-- controller/ledger; the lists below must match ledger.AllStates and
-- ledger.OpenStates (a store test checks both).
CREATE TABLE repairs (
    id                    bigserial   PRIMARY KEY,
    cluster               text        NOT NULL REFERENCES clusters (name),
    node                  text        NOT NULL CHECK (node <> ''),
    nodeclaim             text        NOT NULL DEFAULT '',
    nodeclaim_uid         text        NOT NULL DEFAULT '',   -- precondition of the NodeClaim delete
    nodepool              text        NOT NULL DEFAULT '',
    reason                text        NOT NULL CHECK (reason <> ''),
    fault_class           text        NOT NULL DEFAULT '',
    recommended_action    text        NOT NULL DEFAULT '',   -- what the diagnosis asked for
    executed_action       text        NOT NULL DEFAULT '',   -- what was carried out (decision 6b)
    state                 text        NOT NULL CHECK (state IN (
                              'detected', 'quarantined', 'tolerating', 'awaiting_approval', 'approved',
                              'rejected', 'expired', 'deleting', 'replaced', 'resolved', 'failed', 'cancelled')),
    dry_run               boolean     NOT NULL DEFAULT false,
    toleration_started_at timestamptz,
    toleration_until      timestamptz,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    closed_at             timestamptz,                       -- set exactly when state is terminal
    detail                jsonb       NOT NULL DEFAULT '{}',
    CONSTRAINT repairs_closed_iff_terminal CHECK ((closed_at IS NULL) = (state IN (
        'detected', 'quarantined', 'tolerating', 'awaiting_approval', 'approved', 'deleting')))
);
-- At most one open repair per node: concurrent openers race on this index and
-- exactly one wins (store.OpenRepair).
CREATE UNIQUE INDEX repairs_one_open_per_node ON repairs (cluster, node)
    WHERE state IN ('detected', 'quarantined', 'tolerating', 'awaiting_approval', 'approved', 'deleting');
CREATE INDEX repairs_open_state_idx ON repairs (state) WHERE closed_at IS NULL;
CREATE INDEX repairs_cluster_id_idx ON repairs (cluster, id);
CREATE INDEX repairs_node_id_idx ON repairs (cluster, node, id);
-- maxInFlight per NodePool counts these.
CREATE INDEX repairs_deleting_idx ON repairs (cluster, nodepool) WHERE state = 'deleting';

-- Findings that started or support a repair (soft link: findings may be
-- dropped by retention, the link stays).
CREATE TABLE repair_findings (
    repair_id  bigint NOT NULL REFERENCES repairs (id),
    finding_id text   NOT NULL,
    PRIMARY KEY (repair_id, finding_id)
);

-- Every state change of every repair: who, why, when. Append-only (a trigger
-- refuses UPDATE and DELETE), so repairs cannot be deleted either.
CREATE TABLE repair_audit (
    id         bigserial   PRIMARY KEY,
    repair_id  bigint      NOT NULL REFERENCES repairs (id),
    from_state text,                      -- NULL for the entry that created the repair
    to_state   text        NOT NULL,
    actor      text        NOT NULL CHECK (actor <> ''),
    reason     text        NOT NULL DEFAULT '',
    detail     jsonb       NOT NULL DEFAULT '{}',
    at         timestamptz NOT NULL
);
CREATE INDEX repair_audit_repair_idx ON repair_audit (repair_id, id);
-- The deletions-per-hour budget counts these.
CREATE INDEX repair_audit_deleting_idx ON repair_audit (at) WHERE to_state = 'deleting';

-- +goose StatementBegin
CREATE FUNCTION fleetrepair_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'table % is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER repair_audit_append_only BEFORE UPDATE OR DELETE ON repair_audit
    FOR EACH ROW EXECUTE FUNCTION fleetrepair_append_only();
-- Retention deletes findings (or drops partitions); nothing updates them.
CREATE TRIGGER findings_append_only BEFORE UPDATE ON findings
    FOR EACH ROW EXECUTE FUNCTION fleetrepair_append_only();

-- +goose Down
DROP TABLE repair_audit;
DROP TABLE repair_findings;
DROP TABLE repairs;
DROP TABLE diagnoses;
DROP TABLE findings;
DROP TABLE nodes;
DROP TABLE clusters;
DROP FUNCTION fleetrepair_append_only();
