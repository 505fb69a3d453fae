-- 00007_node_labels: the node labels the breakers form cohorts of (the
-- controller configuration's breaker.labels: a rack, an NVLink domain), so
-- the shadow report replays label cohorts from the stored fleet as the live
-- controller evaluates them.

-- +goose Up
ALTER TABLE nodes ADD COLUMN labels jsonb NOT NULL DEFAULT '{}'::jsonb;

-- +goose Down
ALTER TABLE nodes DROP COLUMN labels;
