-- 00007_node_owners: what a node's owners said about disrupting it, as the
-- deletion guard last read it from Kubernetes (controller/decide
-- Disruption): where fleetrepair.dev/repair=disabled opts it out, which
-- object carries karpenter.sh/do-not-disrupt. '' is none. The shadow
-- report replays it (docs/shadow.md).

-- +goose Up
ALTER TABLE nodes ADD COLUMN opt_out text NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN do_not_disrupt text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE nodes DROP COLUMN do_not_disrupt;
ALTER TABLE nodes DROP COLUMN opt_out;
