package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReconcileChannel is the PostgreSQL NOTIFY channel on which a replica that
// ingested a report hands the node to the replica leading its cluster.
// Payload: "cluster/node" lines, "+cluster/node" for a node with new
// findings (NodeRef.Findings), at most maxNotifyPayload bytes each
// notification. (A replica from before the "+" reads such a line as a
// cluster it does not lead and ignores it; its catch-up pass still finds
// the node's findings.)
const ReconcileChannel = "fleetrepair_reconcile"

// maxNotifyPayload keeps a payload under PostgreSQL's 8000-byte limit.
const maxNotifyPayload = 7900

// NodeRef names one node of one cluster.
type NodeRef struct {
	Cluster, Node string
	// Findings: the node has newly stored findings (NotifyReconcile and
	// ListenReconcile carry it; NodesWithFindingsSince leaves it false).
	Findings bool
}

// NotifyReconcile publishes refs on ReconcileChannel, batched into as few
// notifications as the payload limit allows, in one transaction (delivered
// together on commit). Names hold no newline (ingest validates them).
func (s *Store) NotifyReconcile(ctx context.Context, refs []NodeRef) error {
	if len(refs) == 0 {
		return nil
	}
	var payloads []string
	var b strings.Builder
	for _, r := range refs {
		line := r.Cluster + "/" + r.Node
		if r.Findings {
			line = "+" + line
		}
		if b.Len() > 0 && b.Len()+1+len(line) > maxNotifyPayload {
			payloads = append(payloads, b.String())
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(line)
	}
	payloads = append(payloads, b.String())
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		for _, p := range payloads {
			if _, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", ReconcileChannel, p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return errorf(err, "notify %d nodes to reconcile", len(refs))
	}
	return nil
}

// ListenReconcile listens on ReconcileChannel on a dedicated connection
// (outside the pool) and calls fn for every node notified, until ctx ends;
// it then returns nil. It reconnects with backoff (up to 10 s) when the
// connection fails, reporting each failure to lost, and calls connected
// after every successful LISTEN with the time the previous connection was
// lost (zero the first time): notifications sent while no connection
// listened are lost, so the caller catches up from the store
// (NodesWithFindingsSince).
func (s *Store) ListenReconcile(ctx context.Context, fn func(NodeRef), connected func(lostAt time.Time), lost func(error)) error {
	return s.listen(ctx, ReconcileChannel, func(payload string) {
		for _, line := range strings.Split(payload, "\n") {
			line, findings := strings.CutPrefix(line, "+")
			if c, node, ok := strings.Cut(line, "/"); ok && c != "" && node != "" {
				fn(NodeRef{Cluster: c, Node: node, Findings: findings})
			}
		}
	}, connected, lost)
}

// listen LISTENs on channel on a dedicated connection (outside the pool) and
// calls fn with each notification's payload until ctx ends (then nil),
// reconnecting with backoff (up to 10 s) and reporting as ListenReconcile.
func (s *Store) listen(ctx context.Context, channel string, fn func(payload string), connected func(lostAt time.Time), lost func(error)) error {
	var lostAt time.Time
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, channel, fn, func() {
			backoff = 100 * time.Millisecond
			connected(lostAt)
		})
		if ctx.Err() != nil {
			return nil
		}
		lostAt = time.Now()
		lost(err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
	return nil
}

func (s *Store) listenOnce(ctx context.Context, channel string, fn func(string), connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect listener: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen %s: %w", channel, err)
	}
	connected()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return fmt.Errorf("wait for notification: %w", err)
		}
		fn(n.Payload)
	}
}

// RecentNode is a node with findings stored since some time (NodesWithFindingsSince).
type RecentNode struct {
	NodeRef
	// Newest is when the node's newest finding was stored (received_at).
	Newest time.Time
}

// NodesWithFindingsSince returns the nodes that had a finding stored at or
// after since (received_at), each once, the node with the newest finding
// first (ties by cluster and node name): the reconciler's catch-up for
// triggers lost to a crashed replica, a dropped notification or a
// leaderless gap, which queues the freshest evidence first
// (controller/repair/queue.go, catchUp).
func (s *Store) NodesWithFindingsSince(ctx context.Context, since time.Time) ([]RecentNode, error) {
	rows, err := s.pool.Query(ctx, `SELECT cluster, node, max(received_at) AS newest FROM findings WHERE received_at >= $1
		GROUP BY cluster, node ORDER BY newest DESC, cluster, node`, since.UTC())
	if err != nil {
		return nil, errorf(err, "list nodes with findings since %s", since.Format(time.RFC3339))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RecentNode, error) {
		var n RecentNode
		err := r.Scan(&n.Cluster, &n.Node, &n.Newest)
		return n, err
	})
	if err != nil {
		return nil, errorf(err, "list nodes with findings since %s", since.Format(time.RFC3339))
	}
	return out, nil
}
