-- 00012_node_removed: when the controller saw the node's Kubernetes Node
-- gone (a reconcile of it read NotFound: replaced, scaled down). A removed
-- node stays for its history (node page, repairs, findings) but leaves the
-- fleet counts, the silent-agent gauges and the node list
-- (controller/store/nodes.go sqlNodeLive). NULL: present, or never known to
-- be gone. The Node reappearing clears it; a report of its agent received
-- after removed_at makes it count as present again without a write.

-- +goose Up
ALTER TABLE nodes ADD COLUMN removed_at timestamptz;

-- +goose Down
ALTER TABLE nodes DROP COLUMN removed_at;
