-- 00004_nodepool_budget: a deletions-per-hour budget per NodePool, beside
-- the cluster's (a bad hour in one pool must not spend the whole cluster's
-- budget, nor empty the pool).

-- +goose Up
ALTER TABLE clusters ADD COLUMN nodepool_deletions_per_hour integer NOT NULL DEFAULT 5
    CHECK (nodepool_deletions_per_hour >= 0);

-- +goose Down
ALTER TABLE clusters DROP COLUMN nodepool_deletions_per_hour;
