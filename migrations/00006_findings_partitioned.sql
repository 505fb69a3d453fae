-- 00006_findings_partitioned: findings become a table range-partitioned by
-- received_at (one partition per UTC day, plus a default partition that
-- catches anything outside the created days), and a finding's idempotency key
-- is scoped by node: (cluster, node, id). Before, (cluster, id) made a second
-- node's real finding with a colliding ID a silent duplicate.
--
-- Why received_at: it is written by the controller's clock, never the
-- agent's, so no report can aim at a partition, and retention by dropping a
-- day's partition drops exactly the findings received that day.
--
-- A partitioned table's unique keys must contain the partition key, so the
-- primary key is (id, cluster, node, received_at); a retry of a finding gets a
-- new received_at and is deduplicated by the store instead (IngestReport: a
-- per-node advisory lock, then an anti-join against the partitions the first
-- copy can be in; controller/store/findings.go).
--
-- Nothing references findings by foreign key: repair_findings.finding_id and
-- diagnoses.finding_ids are soft links (with the repair's or diagnosis's
-- cluster and node), so they survive a dropped partition.
--
-- Partitions are created ahead by fleetrepair_findings_partitions (called
-- here for the data already stored and the next days, and periodically by
-- the controller through store.MaintainFindings), which also moves rows that
-- landed in the default partition into their day's partition.

-- +goose Up
ALTER TABLE findings RENAME TO findings_unpartitioned;
DROP TRIGGER findings_append_only ON findings_unpartitioned;
ALTER TABLE findings_unpartitioned RENAME CONSTRAINT findings_pkey TO findings_unpartitioned_pkey;
ALTER INDEX findings_node_received_idx RENAME TO findings_unpartitioned_node_received_idx;

CREATE TABLE findings (
    -- The agent's idempotency key (finding.NewID), unique per node of a cluster.
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
    received_at timestamptz NOT NULL,     -- when the controller stored it (the partition key)
    -- id first: the duplicate check and the lookups by ID probe this index
    -- only (the timeline index below serves (cluster, node) scans).
    PRIMARY KEY (id, cluster, node, received_at)
) PARTITION BY RANGE (received_at);

CREATE TABLE findings_default PARTITION OF findings DEFAULT;

-- The node timeline (store.FindingsForNode) reads a node's newest findings by
-- when they happened: a Merge Append of one backward index scan per partition.
CREATE INDEX findings_node_happened_idx ON findings (cluster, node, (COALESCE(observed_at, received_at)), id);

-- The nodes with findings received since a time (store.NodesWithFindingsSince,
-- every periodic pass): rows arrive in received_at order, so a BRIN index is
-- exact enough and nearly free to maintain.
CREATE INDEX findings_received_brin ON findings USING brin (received_at);

-- Retention drops partitions; nothing updates a finding.
CREATE TRIGGER findings_append_only BEFORE UPDATE ON findings
    FOR EACH ROW EXECUTE FUNCTION fleetrepair_append_only();

-- +goose StatementBegin
-- fleetrepair_findings_partitions creates the daily partitions findings_pYYYYMMDD
-- of the UTC days from_day .. from_day + days - 1 that do not exist yet, moving
-- any rows of those days out of findings_default first, and returns how many
-- it created. Concurrent callers (controller replicas) serialize on an
-- advisory lock.
CREATE FUNCTION fleetrepair_findings_partitions(from_day date, days integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    d       date;
    part    text;
    lo      timestamptz;
    hi      timestamptz;
    created integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('fleetrepair_findings_partitions', 0));
    FOR i IN 0 .. days - 1 LOOP
        d := from_day + i;
        part := 'findings_p' || to_char(d, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(part) IS NOT NULL;
        lo := d::timestamp AT TIME ZONE 'UTC';
        hi := (d + 1)::timestamp AT TIME ZONE 'UTC';
        EXECUTE format('CREATE TABLE %I (LIKE findings INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
        EXECUTE format('WITH moved AS (DELETE FROM findings_default WHERE received_at >= %L AND received_at < %L RETURNING *) '
                       'INSERT INTO %I SELECT * FROM moved', lo, hi, part);
        EXECUTE format('ALTER TABLE findings ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', part, lo, hi);
        created := created + 1;
    END LOOP;
    RETURN created;
END
$$;
-- +goose StatementEnd

-- Partitions for the findings already stored (their days) and the week ahead,
-- then the rows themselves. The old key (cluster, id) was stricter than the
-- new one, so nothing collides.
SELECT fleetrepair_findings_partitions(first_day, (today - first_day) + 8)
FROM (SELECT LEAST(today, COALESCE(oldest, today)) - 1 AS first_day, today
      FROM (SELECT (now() AT TIME ZONE 'UTC')::date AS today,
                   (SELECT min(received_at AT TIME ZONE 'UTC')::date FROM findings_unpartitioned) AS oldest) AS t) AS days;
INSERT INTO findings SELECT id, cluster, node, boot_id, detector, gpu_pci, device_pci, xid, count, attrs,
                            evidence, seq, observed_at, received_at
FROM findings_unpartitioned;
DROP TABLE findings_unpartitioned;

-- +goose Down
-- Back to one table unique on (cluster, id). Findings of different nodes that
-- share an ID cannot both be kept there: the oldest received is kept.
CREATE TABLE findings_unpartitioned (
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
    observed_at timestamptz,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (cluster, id)
);
INSERT INTO findings_unpartitioned
SELECT id, cluster, node, boot_id, detector, gpu_pci, device_pci, xid, count, attrs, evidence, seq, observed_at, received_at
FROM findings ORDER BY received_at
ON CONFLICT (cluster, id) DO NOTHING;
DROP TABLE findings;
DROP FUNCTION fleetrepair_findings_partitions(date, integer);
ALTER TABLE findings_unpartitioned RENAME TO findings;
ALTER TABLE findings RENAME CONSTRAINT findings_unpartitioned_pkey TO findings_pkey;
CREATE INDEX findings_node_received_idx ON findings (cluster, node, received_at);
CREATE TRIGGER findings_append_only BEFORE UPDATE ON findings
    FOR EACH ROW EXECUTE FUNCTION fleetrepair_append_only();
