package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// A reconcile's read (ReadNodes) writes a node's row only when its
// Kubernetes facts changed or it was removed: an unchanged node keeps its
// row version (xmin) and updated_at, and the others are written as before
// (docs/design.md "A reconcile's read writes only what changed").
func TestReadNodesUnchangedNotWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	metas := []store.Node{
		{Cluster: "c1", Name: "n1", NodePool: "gpu", Zone: "a", InstanceType: "p5.48xlarge", NodeClaim: "claim-n1",
			Labels: map[string]string{"topology.kubernetes.io/zone": "a"}},
		{Cluster: "c1", Name: "n2", NodePool: "gpu", Zone: "a"},
		{Cluster: "c1", Name: "n3", NodePool: "gpu", Zone: "b"},
		{Cluster: "c1", Name: "n4", NodePool: "gpu", Zone: "b"},
	}
	if _, err := s.IngestReport(ctx, report("c1", "n1", "boot-a", 1, t0), t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadNodes(ctx, metas, 0, t0); err != nil {
		t.Fatal(err)
	}
	before := rowVersions(t, s)

	// n2's zone changed; n3 was marked removed; n1 and n4 are as stored.
	later := t0.Add(time.Minute)
	if err := s.MarkNodeRemoved(ctx, "c1", "n3", later); err != nil {
		t.Fatal(err)
	}
	removed := rowVersions(t, s)["n3"]
	metas[1].Zone = "c"
	now := later.Add(time.Minute)
	snaps, err := s.ReadNodes(ctx, metas, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	after := rowVersions(t, s)
	for _, n := range []string{"n1", "n4"} {
		if after[n] != before[n] {
			t.Errorf("%s unchanged was written: row %+v -> %+v", n, before[n], after[n])
		}
	}
	if after["n2"].xmin == before["n2"].xmin || !after["n2"].updated.Equal(now) {
		t.Errorf("n2's new zone: row %+v -> %+v, want a new version updated at %s", before["n2"], after["n2"], now)
	}
	if after["n3"].xmin == removed.xmin || !after["n3"].updated.Equal(now) {
		t.Errorf("n3 back after its removal: row %+v -> %+v, want a new version updated at %s", removed, after["n3"], now)
	}
	// The snapshots are the stored rows, written or not.
	for i, m := range metas {
		got, err := s.GetNode(ctx, m.Cluster, m.Name)
		if err != nil {
			t.Fatal(err)
		}
		if snaps[i].Node.Name != m.Name || snaps[i].Node.Zone != m.Zone || snaps[i].Node.Removed() ||
			!snaps[i].Node.UpdatedAt.Equal(got.UpdatedAt) || snaps[i].Node.BootID != got.BootID {
			t.Errorf("snapshot of %s: %+v, stored %+v", m.Name, snaps[i].Node, got)
		}
	}
	if snaps[0].Node.BootID != "boot-a" || snaps[0].Node.Heartbeat == nil {
		t.Errorf("n1's snapshot lost the agent's facts: %+v", snaps[0].Node)
	}
}

// rowVersion is a nodes row's version (xmin) and updated_at.
type rowVersion struct {
	xmin    uint32
	updated time.Time
}

// rowVersions returns cluster c1's rows' versions by node name.
func rowVersions(t *testing.T, s *store.Store) map[string]rowVersion {
	t.Helper()
	rows, _ := s.Pool().Query(context.Background(), `SELECT name, xmin::text::bigint, updated_at FROM nodes WHERE cluster = 'c1'`)
	out := map[string]rowVersion{}
	var (
		name string
		xmin int64
		at   time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &xmin, &at}, func() error {
		out[name] = rowVersion{uint32(xmin), at.UTC()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// An ingest group holding a node's lock (its advisory lock and its row,
// until its transaction ends) does not hold up the reconciles' reads of
// the node when its Kubernetes facts are unchanged, alone or in a group;
// a read that changes the facts of several nodes still takes their
// advisory locks first and waits (the lock order that keeps it from
// deadlocking with the ingest groups, docs/design.md).
func TestReadNodesNotHeldByIngestLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	metas := []store.Node{{Cluster: "c1", Name: "n1", NodePool: "gpu", Zone: "a"}, {Cluster: "c1", Name: "n2", NodePool: "gpu", Zone: "a"}}
	for _, m := range metas {
		if _, err := s.IngestReport(ctx, report("c1", m.Name, "boot-a", 0, t0), t0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ReadNodes(ctx, metas, 0, t0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		metas []store.Node
		wait  bool // the read must wait for the ingest's locks
	}{
		{"one node unchanged", metas[:1], false},
		{"group unchanged", metas, false},
		{"group changed", []store.Node{{Cluster: "c1", Name: "n1", NodePool: "gpu", Zone: "b"}, {Cluster: "c1", Name: "n2", NodePool: "gpu", Zone: "b"}}, true},
	} {
		waited := readWhileIngestLocks(t, s, c.metas, t0.Add(time.Minute))
		if waited != c.wait {
			t.Errorf("%s: the read waited for the ingest's locks: %v, want %v", c.name, waited, c.wait)
		}
	}
	got, err := s.GetNode(ctx, "c1", "n2")
	if err != nil || got.Zone != "b" || got.BootID != "boot-a" {
		t.Fatalf("n2 after the changed read: %+v, %v; want zone b and the agent's boot", got, err)
	}
}

// readWhileIngestLocks reads metas (ReadNodes) while another transaction
// holds n1's locks as an ingest group does (sqlLockNodes' advisory lock,
// then the row written), and reports whether the read waited for a lock.
// The other transaction ends once the read returned or was seen waiting
// (a lock not granted in pg_locks), so the read always ends.
func readWhileIngestLocks(t *testing.T, s *store.Store, metas []store.Node, now time.Time) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('c1' || '/' || 'n1', 0))`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET last_seen = $1 WHERE cluster = 'c1' AND name = 'n1'`, now); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.ReadNodes(ctx, metas, 0, now)
		done <- err
	}()
	waited := false
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return waited
		case <-time.After(5 * time.Millisecond):
		}
		if waited {
			continue
		}
		var blocked int
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted
			AND pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database())`).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked > 0 {
			waited = true
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}
