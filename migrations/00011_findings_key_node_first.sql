-- 00011_findings_key_node_first: the primary key of findings becomes
-- (cluster, node, id, received_at) instead of (id, cluster, node,
-- received_at); same columns, so the same uniqueness.
--
-- Why: finding IDs are random hashes (finding.NewID), so with id first every
-- inserted finding, and every duplicate probe, lands on a random leaf page
-- of its day's key; once a day's key outgrows the buffer cache each finding
-- costs a page read and a dirtied page. With the node first, a report's
-- findings (one node) go to one region of the key, and the probe of a
-- report's findings reads the same few leaf pages (docs/scale.md, "Ingest at
-- fleet rate"; COPY of 100,000 findings into a day of 1,000,000: 1.3-1.5 s
-- instead of 1.9-2.6 s). Every reader by ID names the node too
-- (store.FindingsByIDs, the duplicate probe sqlStoredProbe,
-- RepairFindings), so the key still serves them.
--
-- Cost of the migration: the key of every partition is rebuilt, under an
-- ACCESS EXCLUSIVE lock on findings (ingest waits; about a second per
-- million findings).
--
-- fleetrepair_findings_compact (migration 00010) recreated the key with
-- fixed columns; it now copies the column list of the primary key of
-- findings, so it follows this key and any later one. Down restores the old
-- key and keeps this version of the function (right for either key).

-- +goose Up
ALTER TABLE findings DROP CONSTRAINT findings_pkey,
    ADD CONSTRAINT findings_pkey PRIMARY KEY (cluster, node, id, received_at);

-- +goose StatementBegin
-- fleetrepair_findings_compact rewrites the daily partition part (named
-- findings_pYYYYMMDD) in node-timeline order and returns its row count,
-- -1 when part is not a partition of findings (dropped meanwhile), or -2
-- when another session is compacting (one rewrite at a time across
-- replicas; the caller skips its turn). It serializes with
-- fleetrepair_findings_partitions on that function's advisory lock.
CREATE OR REPLACE FUNCTION fleetrepair_findings_compact(part text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    d     date;
    lo    timestamptz;
    hi    timestamptz;
    tmp   text := part || '_c';
    n     bigint;
    ix    record;
    names jsonb;
    pkey  text;
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
    -- The primary key columns of findings, in key order.
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.ord) INTO pkey
    FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = 'findings'::regclass AND i.indisprimary;
    IF pkey IS NULL THEN
        RAISE EXCEPTION 'compact findings: findings has no primary key';
    END IF;

    EXECUTE format('LOCK TABLE %I IN SHARE MODE', part);
    EXECUTE format('CREATE TABLE %I (LIKE findings INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', tmp);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (received_at >= %L AND received_at < %L)',
                   tmp, tmp || '_bound', lo, hi);
    EXECUTE format('INSERT INTO %I SELECT * FROM %I ORDER BY cluster, node, COALESCE(observed_at, received_at), id',
                   tmp, part);
    GET DIAGNOSTICS n = ROW_COUNT;
    -- The indexes of findings (migrations/00006_findings_partitioned.sql,
    -- the key of this migration), built before ATTACH so that it adopts
    -- them instead of building them under its lock. TestCompactFindings
    -- checks that a rewritten partition has the same index definitions as
    -- one that was not.
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (%s)', tmp, tmp || '_pkey', pkey);
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
ALTER TABLE findings DROP CONSTRAINT findings_pkey,
    ADD CONSTRAINT findings_pkey PRIMARY KEY (id, cluster, node, received_at);
