package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Cluster is one Kubernetes cluster the controller serves, with its deletion
// budgets (docs/design.md, decision 7).
type Cluster struct {
	Name      string
	CreatedAt time.Time
	// DeletionsPerHour is how many repairs may enter state deleting per
	// sliding hour; 0 stops deletions.
	DeletionsPerHour int
	// MaxInFlightPerNodePool is how many repairs may be in state deleting at
	// once per NodePool; 0 stops deletions.
	MaxInFlightPerNodePool int
	// NodePoolDeletionsPerHour is how many repairs of one NodePool may
	// enter state deleting per sliding hour (SetNodePoolBudget); 0 stops
	// deletions.
	NodePoolDeletionsPerHour int
}

// Node is what the controller knows about one node: facts from its agent
// (BootID, versions, Heartbeat, LastSeen) and from Kubernetes (NodePool,
// Zone, InstanceType, NodeClaim). Empty strings mean unknown.
type Node struct {
	Cluster string
	Name    string

	BootID        string
	DriverVersion string
	KernelVersion string
	AgentVersion  string
	// Heartbeat is the newest heartbeat received; nil before the first.
	Heartbeat *finding.Heartbeat
	// LastSeen is when the controller last received a report from the
	// agent; zero when it never has.
	LastSeen time.Time

	NodePool     string
	Zone         string
	InstanceType string
	NodeClaim    string
	// Labels are the node's labels the breakers form cohorts of (the
	// controller configuration's breaker.labels), as the reconciler last
	// saw them; nil when none.
	Labels map[string]string
	// OptOut and DoNotDisrupt are the owners' word on disrupting the node
	// as the deletion guard last read it (controller/decide Disruption:
	// "NodePool gpu", "Pod ml/train-0"; "" none), kept by SetNodeOwners.
	OptOut       string
	DoNotDisrupt string

	// RemovedAt is when the controller saw the node's Kubernetes Node gone
	// (MarkNodeRemoved); zero while it is present. Removed tells whether
	// that still holds.
	RemovedAt time.Time

	CreatedAt time.Time
	UpdatedAt time.Time
}

// Removed reports whether the node is out of the fleet: its Node was seen
// gone (RemovedAt) and its agent has not reported since (a report after
// the removal means a node of that name is back). The SQL twin is
// sqlNodeLive.
func (n Node) Removed() bool {
	return !n.RemovedAt.IsZero() && !n.LastSeen.After(n.RemovedAt)
}

// sqlNodeLive is the SQL form of !Node.Removed for the nodes row aliased n:
// the fleet counts, the agent gauges and the node list keep only these.
const sqlNodeLive = `(n.removed_at IS NULL OR COALESCE(n.last_seen > n.removed_at, false))`

const (
	sqlClusterCols = `name, created_at, deletions_per_hour, max_in_flight_per_nodepool, nodepool_deletions_per_hour`

	sqlSetClusterBudget = `
INSERT INTO clusters (name, created_at, deletions_per_hour, max_in_flight_per_nodepool)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE SET
    deletions_per_hour = excluded.deletions_per_hour,
    max_in_flight_per_nodepool = excluded.max_in_flight_per_nodepool
RETURNING ` + sqlClusterCols

	sqlSetNodePoolBudget = `
INSERT INTO clusters (name, created_at, nodepool_deletions_per_hour) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET nodepool_deletions_per_hour = excluded.nodepool_deletions_per_hour`

	sqlGetCluster   = `SELECT ` + sqlClusterCols + ` FROM clusters WHERE name = $1`
	sqlListClusters = `SELECT ` + sqlClusterCols + ` FROM clusters ORDER BY name`

	nodeCols = `cluster, name, boot_id, driver_version, kernel_version, agent_version, heartbeat, last_seen,
nodepool, zone, instance_type, nodeclaim, created_at, updated_at, labels, opt_out, do_not_disrupt, removed_at`

	sqlGetNode = `SELECT ` + nodeCols + ` FROM nodes WHERE cluster = $1 AND name = $2`
	// $1 = '' lists every cluster.
	sqlListNodes = `SELECT ` + nodeCols + ` FROM nodes WHERE $1 = '' OR cluster = $1 ORDER BY cluster, name`

	// sqlReadNodesMeta records the Kubernetes columns of the nodes $1/$2
	// (ReadNodes: $3-$6 and $8 their values, distinct nodes; $7 now) and
	// returns every one's row (nodeCols). The agent's columns are
	// IngestReport's. The Node is there (the reconciler read it): no longer
	// removed.
	//
	// A node whose row already holds these values and is not removed (what
	// almost every reconcile finds: a node's Kubernetes facts rarely change)
	// is read, not written: no new row version, no row lock, no advisory
	// lock, so a reconcile never waits for an ingest group holding the
	// node's lock and never makes one wait (docs/design.md "A reconcile's
	// read writes only what changed"). Only the others (a new node, a changed
	// fact, a removed node whose Node is back) are upserted; when there is
	// more than one, their advisory locks are taken first, in key order
	// (sqlLockKeys, as the ingest groups take them, groupcommit.go), in
	// the same statement and for exactly the nodes it writes: several row
	// locks in one transaction, which could otherwise deadlock with an
	// ingest group upserting the same nodes in another order. The
	// unchanged rows are the statement's snapshot, as any read; the written
	// ones the latest version (ON CONFLICT), with the agent's columns as
	// the last report left them.
	sqlReadNodesMeta = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $8::jsonb[])
    AS u(cluster, name, nodepool, zone, instance_type, nodeclaim, labels)),
unchanged AS MATERIALIZED (
    SELECT s.* FROM input u
    CROSS JOIN LATERAL (SELECT * FROM nodes WHERE cluster = u.cluster AND name = u.name OFFSET 0) s
    WHERE s.removed_at IS NULL
      AND (s.nodepool, s.zone, s.instance_type, s.nodeclaim, s.labels) = (u.nodepool, u.zone, u.instance_type, u.nodeclaim, u.labels)),
changed AS MATERIALIZED (
    SELECT u.* FROM input u WHERE NOT EXISTS (SELECT FROM unchanged k WHERE k.cluster = u.cluster AND k.name = u.name)),
locked AS MATERIALIZED (
    ` + sqlLockKeys + `(SELECT cluster, name FROM changed WHERE (SELECT count(*) FROM changed) > 1) AS t(c, n)` + sqlLockKeysEnd + `),
written AS (
    INSERT INTO nodes AS n (cluster, name, nodepool, zone, instance_type, nodeclaim, created_at, updated_at, labels)
    SELECT c.cluster, c.name, c.nodepool, c.zone, c.instance_type, c.nodeclaim, $7::timestamptz, $7::timestamptz, c.labels
    FROM changed c CROSS JOIN locked -- the locks' one row: taken before the first row is written
    ON CONFLICT (cluster, name) DO UPDATE SET
        nodepool = excluded.nodepool,
        labels = excluded.labels,
        zone = excluded.zone,
        instance_type = excluded.instance_type,
        nodeclaim = excluded.nodeclaim,
        updated_at = excluded.updated_at,
        removed_at = NULL
    RETURNING n.*)
SELECT ` + nodeCols + ` FROM written
UNION ALL
SELECT ` + nodeCols + ` FROM unchanged`
)

// SetNodePoolBudget sets how many NodeClaim deletions each NodePool of the
// cluster may start per sliding hour, creating the cluster row when it does
// not exist. Negative is ErrInvalid.
func (s *Store) SetNodePoolBudget(ctx context.Context, cluster string, deletionsPerHour int, now time.Time) error {
	if cluster == "" || deletionsPerHour < 0 {
		return invalidf("set nodepool budget of cluster %q: need a name and a budget >= 0 (got %d/h)", cluster, deletionsPerHour)
	}
	if _, err := s.pool.Exec(ctx, sqlSetNodePoolBudget, cluster, now, deletionsPerHour); err != nil {
		return errorf(err, "set nodepool budget of cluster %s", cluster)
	}
	return nil
}

// SetClusterBudget sets a cluster's deletion budgets, creating the cluster
// row (created_at = now) when it does not exist. Negative values are
// ErrInvalid.
func (s *Store) SetClusterBudget(ctx context.Context, cluster string, deletionsPerHour, maxInFlightPerNodePool int, now time.Time) (Cluster, error) {
	if cluster == "" || deletionsPerHour < 0 || maxInFlightPerNodePool < 0 {
		return Cluster{}, invalidf("set budget of cluster %q: need a name and budgets >= 0 (got %d/h, %d in flight)", cluster, deletionsPerHour, maxInFlightPerNodePool)
	}
	rows, _ := s.pool.Query(ctx, sqlSetClusterBudget, cluster, now, deletionsPerHour, maxInFlightPerNodePool)
	c, err := pgx.CollectExactlyOneRow(rows, scanCluster)
	if err != nil {
		return Cluster{}, errorf(err, "set budget of cluster %s", cluster)
	}
	return c, nil
}

// GetCluster returns the cluster named name, or ErrNotFound.
func (s *Store) GetCluster(ctx context.Context, name string) (Cluster, error) {
	rows, _ := s.pool.Query(ctx, sqlGetCluster, name)
	c, err := pgx.CollectExactlyOneRow(rows, scanCluster)
	if err != nil {
		return Cluster{}, errorf(err, "get cluster %s", name)
	}
	return c, nil
}

// ListClusters returns every cluster, by name.
func (s *Store) ListClusters(ctx context.Context) ([]Cluster, error) {
	rows, _ := s.pool.Query(ctx, sqlListClusters)
	cs, err := pgx.CollectRows(rows, scanCluster)
	if err != nil {
		return nil, errorf(err, "list clusters")
	}
	return cs, nil
}

func scanCluster(row pgx.CollectableRow) (Cluster, error) {
	var c Cluster
	err := row.Scan(&c.Name, &c.CreatedAt, &c.DeletionsPerHour, &c.MaxInFlightPerNodePool, &c.NodePoolDeletionsPerHour)
	c.CreatedAt = c.CreatedAt.UTC()
	return c, err
}

// GetNode returns one node, or ErrNotFound.
func (s *Store) GetNode(ctx context.Context, cluster, name string) (Node, error) {
	rows, _ := s.pool.Query(ctx, sqlGetNode, cluster, name)
	n, err := pgx.CollectExactlyOneRow(rows, scanNode)
	if err != nil {
		return Node{}, errorf(err, "get node %s/%s", cluster, name)
	}
	return n, nil
}

// ListNodes returns the nodes of a cluster by name; cluster "" lists the
// nodes of every cluster, by cluster and name.
func (s *Store) ListNodes(ctx context.Context, cluster string) ([]Node, error) {
	rows, _ := s.pool.Query(ctx, sqlListNodes, cluster)
	ns, err := pgx.CollectRows(rows, scanNode)
	if err != nil {
		return nil, errorf(err, "list nodes of cluster %q", cluster)
	}
	return ns, nil
}

const sqlMarkNodeRemoved = `
UPDATE nodes SET removed_at = $3, updated_at = $3
WHERE cluster = $1 AND name = $2 AND (removed_at IS NULL OR last_seen > removed_at)`

// MarkNodeRemoved records that the node's Kubernetes Node is gone at now
// (the reconciler read NotFound: replaced, scaled down), so the node leaves
// the fleet counts, the agent gauges and the node list while its history
// stays readable (Node.Removed). A node already removed keeps its first
// removal time; a node not stored writes nothing. Cleared by the Node
// coming back (ReadNode) or, without a write, by a report
// of its agent received after now. SweepRemovedNodes is the same for every
// node a complete Node list no longer holds.
func (s *Store) MarkNodeRemoved(ctx context.Context, cluster, node string, now time.Time) error {
	if _, err := s.pool.Exec(ctx, sqlMarkNodeRemoved, cluster, node, now); err != nil {
		return errorf(err, "mark node %s/%s removed", cluster, node)
	}
	return nil
}

// The removed-node sweep (SweepRemovedNodes) in two statements:
// sqlSweepCandidates reads the names of the cluster's nodes that are
// present (sqlNodeLive) and that neither the reconciler wrote nor the agent
// reported at or after $2 (the Node list's time), nor the agent reported at
// or after $3 (the grace); the caller takes the listed Nodes out of them,
// and sqlSweepMark marks the rest, checking the same conditions again on
// each row (a node a reconcile recorded meanwhile is left alone). The set
// difference is computed in Go: planned in SQL against a table with fresh
// statistics, an anti-join became a nested loop, 50 million comparisons
// for 10,000 nodes (BenchmarkSweepRemovedNodes). sqlSweepMark finds its
// rows by the primary key (cluster, name = ANY) and returns each marked
// node and whether it has active diagnoses.
const (
	sqlSweepCond = sqlNodeLive + `
  AND n.updated_at < $%[1]d AND n.created_at < $%[1]d
  AND (n.last_seen IS NULL OR n.last_seen < LEAST($%[1]d, $%[2]d))`
)

var (
	sqlSweepCandidates = `SELECT n.name FROM nodes n WHERE n.cluster = $1 AND ` + fmt.Sprintf(sqlSweepCond, 2, 3)
	sqlSweepMark       = `
UPDATE nodes n SET removed_at = $3, updated_at = $3
WHERE n.cluster = $1 AND n.name = ANY ($2) AND ` + fmt.Sprintf(sqlSweepCond, 4, 5) + `
RETURNING n.name, EXISTS (SELECT 1 FROM diagnoses d WHERE d.cluster = n.cluster AND d.node = n.name AND d.active)`
)

// NodeSweep is one sweep of a cluster's stored nodes against a complete
// list of its Kubernetes Nodes (SweepRemovedNodes).
type NodeSweep struct {
	Cluster string
	// Present are the names of every Node of the cluster, as a synced
	// informer cache (or a complete list from the API server) held them at
	// ListedAt. An incomplete list marks present nodes removed: the caller
	// vouches for it.
	Present  []string
	ListedAt time.Time
	// SilentBefore: a node whose agent reported at or after it is left
	// alone (its machine is there; the Node may be on its way back). Zero:
	// ListedAt.
	SilentBefore time.Time
}

// SweptNode is a node SweepRemovedNodes marked removed.
type SweptNode struct {
	Name string
	// ActiveDiagnoses: the node still has active diagnoses, which its
	// reconcile deactivates (the node-gone path of controller/repair).
	ActiveDiagnoses bool
}

// SweepRemovedNodes marks removed at now (as MarkNodeRemoved does; one
// read of the cluster's names and, when some are gone, one update for all
// of them) every node of sw.Cluster that the store
// holds as present (not Node.Removed) but sw.Present does not name: a Node
// deleted while no controller watched, or whose delete event the informer
// missed. It leaves alone a node whose row was written (the reconciler
// recorded its Node) or whose agent reported at or after sw.ListedAt, the
// list being older than that write, and a node whose agent reported at or
// after sw.SilentBefore. Nodes of other clusters are never touched; a node
// marked comes back as after MarkNodeRemoved. Returns the nodes marked, by
// name; ErrInvalid without a cluster or ListedAt.
func (s *Store) SweepRemovedNodes(ctx context.Context, sw NodeSweep, now time.Time) ([]SweptNode, error) {
	if sw.Cluster == "" || sw.ListedAt.IsZero() {
		return nil, invalidf("sweep removed nodes of cluster %q: need a cluster and the time of its Node list", sw.Cluster)
	}
	silent := sw.SilentBefore
	if silent.IsZero() {
		silent = sw.ListedAt
	}
	rows, _ := s.pool.Query(ctx, sqlSweepCandidates, sw.Cluster, sw.ListedAt, silent)
	stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, errorf(err, "sweep removed nodes of cluster %s", sw.Cluster)
	}
	listed := make(map[string]struct{}, len(sw.Present))
	for _, n := range sw.Present {
		listed[n] = struct{}{}
	}
	gone := stored[:0]
	for _, n := range stored {
		if _, ok := listed[n]; !ok {
			gone = append(gone, n)
		}
	}
	if len(gone) == 0 {
		return nil, nil
	}
	rows, _ = s.pool.Query(ctx, sqlSweepMark, sw.Cluster, gone, now, sw.ListedAt, silent)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (SweptNode, error) {
		var n SweptNode
		err := row.Scan(&n.Name, &n.ActiveDiagnoses)
		return n, err
	})
	if err != nil {
		return nil, errorf(err, "sweep removed nodes of cluster %s", sw.Cluster)
	}
	slices.SortFunc(out, func(a, b SweptNode) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

const sqlPresentNodes = `
SELECT n.name FROM nodes n WHERE n.cluster = $1 AND n.name = ANY ($2) AND ` + sqlNodeLive

// PresentNodes returns which of names are stored nodes of the cluster that
// are not removed (Node.Removed): nodes the reconciler or an agent knows.
// Names neither knows (a job's host name taken for a Node) are absent.
func (s *Store) PresentNodes(ctx context.Context, cluster string, names []string) (map[string]bool, error) {
	rows, _ := s.pool.Query(ctx, sqlPresentNodes, cluster, names)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, errorf(err, "look up nodes of cluster %s", cluster)
	}
	out := make(map[string]bool, len(got))
	for _, n := range got {
		out[n] = true
	}
	return out, nil
}

const sqlSetNodeOwners = `
UPDATE nodes SET opt_out = $3, do_not_disrupt = $4, updated_at = $5
WHERE cluster = $1 AND name = $2 AND (opt_out <> $3 OR do_not_disrupt <> $4)`

// SetNodeOwners records the owners' word on disrupting a node (see
// Node.OptOut, Node.DoNotDisrupt) as the deletion guard read it at now. An
// unchanged value, or a node not stored, writes nothing.
func (s *Store) SetNodeOwners(ctx context.Context, cluster, node, optOut, doNotDisrupt string, now time.Time) error {
	if _, err := s.pool.Exec(ctx, sqlSetNodeOwners, cluster, node, optOut, doNotDisrupt, now); err != nil {
		return errorf(err, "set owners of node %s/%s", cluster, node)
	}
	return nil
}

func scanNode(row pgx.CollectableRow) (Node, error) { return scanNodeWith(row) }

// scanNodeWith scans nodeCols followed by the extra columns into extra.
func scanNodeWith(row pgx.CollectableRow, extra ...any) (Node, error) {
	var (
		n        Node
		hb       []byte
		lastSeen *time.Time
		removed  *time.Time
		labels   []byte
	)
	err := row.Scan(append([]any{&n.Cluster, &n.Name, &n.BootID, &n.DriverVersion, &n.KernelVersion, &n.AgentVersion,
		&hb, &lastSeen, &n.NodePool, &n.Zone, &n.InstanceType, &n.NodeClaim, &n.CreatedAt, &n.UpdatedAt, &labels,
		&n.OptOut, &n.DoNotDisrupt, &removed}, extra...)...)
	if err != nil {
		return n, err
	}
	if hb != nil {
		n.Heartbeat = new(finding.Heartbeat)
		if err := json.Unmarshal(hb, n.Heartbeat); err != nil {
			return n, err
		}
	}
	if len(labels) > 2 { // "{}": none
		if err := json.Unmarshal(labels, &n.Labels); err != nil {
			return n, err
		}
	}
	n.LastSeen, n.RemovedAt = fromNull(lastSeen), fromNull(removed)
	n.CreatedAt, n.UpdatedAt = n.CreatedAt.UTC(), n.UpdatedAt.UTC()
	return n, nil
}

// labelsDoc is the labels column's JSON document ("{}" for none).
func labelsDoc(l map[string]string) []byte {
	if len(l) == 0 {
		return []byte("{}")
	}
	b, _ := json.Marshal(l) // a map of strings always encodes
	return b
}
