-- 00010_findings_compaction: a closed day's partition of findings is
-- rewritten once in node-timeline order, (cluster, node, happened, id), so
-- that a node's findings of that day lie on a few adjacent heap pages
-- instead of one page each among the whole fleet's (rows arrive in
-- received_at order, every node interleaved with every other).
--
-- Why: the node timeline (store.FindingsForNode) is one backward index scan
-- per partition, and its cost was the random heap fetches, about one buffer
-- per finding (docs/scale.md, "History"). After the rewrite the same 500
-- findings come from a few pages per partition.
--
-- How, without blocking readers or ingest: the old partition is locked in
-- SHARE mode (reads go on; nothing writes a day that ended, received_at is
-- the controller's clock), copied in order into a new table with the
-- partition's indexes and a CHECK constraint equal to its bound (so ATTACH
-- scans nothing), and swapped in: DETACH, ATTACH, DROP, renames. Only the
-- swap takes ACCESS EXCLUSIVE on findings, for milliseconds; the caller
-- (store.CompactFindings) sets a lock timeout and retries at the next
-- maintenance pass. The partition keeps its name and its rows, exactly.
--
-- finding_partition_compactions records which partitions were rewritten, so
-- each is rewritten once.

-- +goose Up
CREATE TABLE finding_partition_compactions (
    partition    text        PRIMARY KEY CHECK (partition ~ '^findings_p[0-9]{8}$'),
    rows         bigint      NOT NULL CHECK (rows >= 0),
    compacted_at timestamptz NOT NULL
);

-- +goose StatementBegin
-- fleetrepair_findings_compact rewrites the daily partition part (named
-- findings_pYYYYMMDD) in node-timeline order and returns its row count,
-- -1 when part is not a partition of findings (dropped meanwhile), or -2
-- when another session is compacting (one rewrite at a time across
-- replicas; the caller skips its turn). It serializes with
-- fleetrepair_findings_partitions on that function's advisory lock.
CREATE FUNCTION fleetrepair_findings_compact(part text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    d     date;
    lo    timestamptz;
    hi    timestamptz;
    tmp   text := part || '_c';
    n     bigint;
    ix    record;
    names jsonb;
BEGIN
    IF part !~ '^findings_p[0-9]{8}$' THEN
        RAISE EXCEPTION 'compact findings: % is not a daily partition name', part;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('fleetrepair_findings_compact', 0)) THEN
        RETURN -2;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('fleetrepair_findings_partitions', 0));
    IF NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                   WHERE i.inhparent = 'findings'::regclass AND c.relname = part) THEN
        RETURN -1;
    END IF;
    d := to_date(substr(part, 11), 'YYYYMMDD');
    lo := d::timestamp AT TIME ZONE 'UTC';
    hi := (d + 1)::timestamp AT TIME ZONE 'UTC';

    EXECUTE format('LOCK TABLE %I IN SHARE MODE', part);
    EXECUTE format('CREATE TABLE %I (LIKE findings INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', tmp);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (received_at >= %L AND received_at < %L)',
                   tmp, tmp || '_bound', lo, hi);
    EXECUTE format('INSERT INTO %I SELECT * FROM %I ORDER BY cluster, node, COALESCE(observed_at, received_at), id',
                   tmp, part);
    GET DIAGNOSTICS n = ROW_COUNT;
    -- The indexes of findings (migrations/00006_findings_partitioned.sql),
    -- built before ATTACH so that it adopts them instead of building them
    -- under its lock. TestCompactFindings checks that a rewritten partition
    -- has the same index definitions as one that was not.
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (id, cluster, node, received_at)', tmp, tmp || '_pkey');
    EXECUTE format('CREATE INDEX %I ON %I (cluster, node, (COALESCE(observed_at, received_at)), id)', tmp || '_happened', tmp);
    EXECUTE format('CREATE INDEX %I ON %I USING brin (received_at)', tmp || '_received', tmp);
    EXECUTE format('ANALYZE %I', tmp);

    -- The old partition's index names by definition (the name taken out),
    -- to give the new indexes the same names once the old ones are gone.
    SELECT jsonb_object_agg(regexp_replace(pg_get_indexdef(i.indexrelid), '^(CREATE (UNIQUE )?INDEX )\S+ ON \S+', '\1'), c.relname)
    INTO names
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = part::regclass;

    EXECUTE format('ALTER TABLE findings DETACH PARTITION %I', part);
    EXECUTE format('ALTER TABLE findings ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', tmp, lo, hi);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', tmp, tmp || '_bound');
    EXECUTE format('DROP TABLE %I', part);
    EXECUTE format('ALTER TABLE %I RENAME TO %I', tmp, part);
    FOR ix IN SELECT c.relname, i.indisprimary,
                     names ->> regexp_replace(pg_get_indexdef(i.indexrelid), '^(CREATE (UNIQUE )?INDEX )\S+ ON \S+', '\1') AS old
              FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = part::regclass LOOP
        CONTINUE WHEN ix.old IS NULL;
        IF ix.indisprimary THEN
            EXECUTE format('ALTER TABLE %I RENAME CONSTRAINT %I TO %I', part, ix.relname, ix.old);
        ELSE
            EXECUTE format('ALTER INDEX %I RENAME TO %I', ix.relname, ix.old);
        END IF;
    END LOOP;

    INSERT INTO finding_partition_compactions (partition, rows, compacted_at) VALUES (part, n, now())
    ON CONFLICT (partition) DO UPDATE SET rows = excluded.rows, compacted_at = excluded.compacted_at;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fleetrepair_findings_compact(text);
DROP TABLE finding_partition_compactions;
