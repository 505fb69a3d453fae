package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/jackc/pgx/v5"
)

// EnvHistoryBench enables BenchmarkHistory, which generates its data set
// first (minutes): 10,000,000 findings over 30 daily partitions of 10,000
// nodes, and 1,000,000 closed repairs with two audit entries and three
// finding links each. FLEETREPAIR_HISTORY_FINDINGS overrides the number of
// findings (repairs are a tenth of it).
const EnvHistoryBench = "FLEETREPAIR_HISTORY_BENCH"

const (
	historyNodes = 10000
	historyDays  = 30
)

var (
	historyOnce  sync.Once
	historyStore *store.Store
	historyEnd   = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
)

// historyData generates the data set once per test binary (generate_series
// in the database, not row by row from Go).
func historyData(b *testing.B) *store.Store {
	if os.Getenv(EnvHistoryBench) == "" {
		b.Skipf("set %s=1 to generate 10M findings and 1M repairs and measure the history queries", EnvHistoryBench)
	}
	historyOnce.Do(func() {
		nFindings := 10_000_000
		if v := os.Getenv("FLEETREPAIR_HISTORY_FINDINGS"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				b.Fatal(err)
			}
			nFindings = n
		}
		nRepairs := nFindings / 10
		ctx := context.Background()
		s := open(b)
		start := historyEnd.AddDate(0, 0, -historyDays)
		began := time.Now()
		steps := []struct {
			what string
			sql  string
			args []any
		}{
			{"partitions", `SELECT fleetrepair_findings_partitions($1::date, $2)`, []any{start, historyDays + 1}},
			{"cluster", `INSERT INTO clusters (name, created_at) VALUES ('c1', $1)`, []any{start}},
			{"findings", `
INSERT INTO findings (id, cluster, node, boot_id, detector, gpu_pci, xid, count, attrs, evidence, seq, observed_at, received_at)
SELECT 'f' || g, 'c1', 'node-' || (g % $2), 'boot-1', 'xid', '0000:3b:00.0', 79, 1, '{"pid":"4242"}'::jsonb,
       '["NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."]'::jsonb, g,
       t.at - interval '1 second', t.at
FROM generate_series(1, $1) g, LATERAL (SELECT $3::timestamptz + (g::float8 / $1) * ($4::timestamptz - $3::timestamptz) AS at) t`,
				[]any{nFindings, historyNodes, start, historyEnd}},
			{"repairs", `
INSERT INTO repairs (cluster, node, nodeclaim, nodepool, reason, fault_class, recommended_action, executed_action, state,
                     created_at, updated_at, closed_at)
SELECT 'c1', 'node-' || (g % $2), 'claim-' || g, 'gpu', 'GPUFallenOffBus', 'accelerated-hardware', 'replace', 'replace', 'resolved',
       t.at, t.at + interval '1 hour', t.at + interval '1 hour'
FROM generate_series(1, $1) g, LATERAL (SELECT $3::timestamptz + (g::float8 / $1) * ($4::timestamptz - $3::timestamptz) AS at) t`,
				[]any{nRepairs, historyNodes, start, historyEnd}},
			{"audit", `
INSERT INTO repair_audit (repair_id, from_state, to_state, actor, reason, at)
SELECT id, NULL, 'detected', 'controller', 'opened', created_at FROM repairs
UNION ALL
SELECT id, 'detected', 'resolved', 'controller', 'replacement verified', closed_at FROM repairs`, nil},
			// Repair r of node k links three findings of node k:
			// f(k + nodes*m) is on node k.
			{"links", `
INSERT INTO repair_findings (repair_id, finding_id)
SELECT r.id, 'f' || ((r.id % $1) + $1 * (((r.id / $1) * 3 + j) % ($2 / $1)))
FROM repairs r, generate_series(0, 2) j
ON CONFLICT DO NOTHING`, []any{historyNodes, nFindings}},
			{"analyze", `ANALYZE`, nil},
		}
		for _, st := range steps {
			t := time.Now()
			if _, err := s.Pool().Exec(ctx, st.sql, st.args...); err != nil {
				b.Fatalf("generate %s: %v", st.what, err)
			}
			b.Logf("generated %s in %v", st.what, time.Since(t).Round(time.Millisecond))
		}
		b.Logf("data set: %d findings, %d repairs in %v", nFindings, nRepairs, time.Since(began).Round(time.Second))
		historyStore = s
		logPlans(b, s, nRepairs)
	})
	if historyStore == nil {
		b.Fatal("no history data set")
	}
	return historyStore
}

// logPlans logs the EXPLAIN (ANALYZE, BUFFERS) plan of each history query
// for one node and one repair.
func logPlans(b *testing.B, s *store.Store, nRepairs int) {
	plans := []struct {
		name string
		sql  string
		args []any
	}{
		{"node timeline (FindingsForNode, newest 500)", store.SQLFindingsForNode, []any{"c1", "node-42", time.Time{}, 500}},
		{"node repair history (ListRepairs cluster+node, 100)", "SELECT " + store.RepairCols +
			" FROM repairs r WHERE r.cluster = $1 AND r.node = $2 ORDER BY r.id DESC LIMIT $3", []any{"c1", "node-42", 101}},
		{"cluster repair history (ListRepairs cluster, 50)", "SELECT " + store.RepairCols +
			" FROM repairs r WHERE r.cluster = $1 ORDER BY r.id DESC LIMIT $2", []any{"c1", 51}},
		{"repair findings (RepairFindings)", store.SQLRepairFindings, []any{int64(nRepairs / 2)}},
		{"repair audit (RepairAudit)", store.SQLRepairAudit, []any{int64(nRepairs / 2)}},
	}
	for _, p := range plans {
		logPlan(b, s, p.name, p.sql, p.args...)
	}
}

// logPlan logs the EXPLAIN (ANALYZE, BUFFERS) plan of one query.
func logPlan(b *testing.B, s *store.Store, name, sql string, args ...any) {
	rows, _ := s.Pool().Query(context.Background(), "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatalf("explain %s: %v", name, err)
	}
	b.Logf("EXPLAIN %s:\n%s", name, strings.Join(lines, "\n"))
}

// BenchmarkHistory measures the history queries the API serves on the data
// set of historyData, for a random node or repair per iteration, and reports
// p50 and p99 latency: the node timeline (GET /api/v1/nodes/{cluster}/{node}
// reads the newest 500 findings and the node's last 100 repairs), the
// cluster's repair history (a page of 50) and one repair with its audit and
// findings (GET /api/v1/repairs/{id}).
//
//	FLEETREPAIR_HISTORY_BENCH=1 go test ./controller/store -run '^$' -bench History -benchtime 2000x -timeout 60m -v
func BenchmarkHistory(b *testing.B) {
	s := historyData(b)
	ctx := context.Background()
	var nRepairs, nFindings int64
	if err := s.Pool().QueryRow(ctx, `SELECT (SELECT max(id) FROM repairs), (SELECT count(*) FROM findings)`).Scan(&nRepairs, &nFindings); err != nil {
		b.Fatal(err)
	}
	wantTimeline := min(500, int(nFindings/historyNodes))
	wantRepairs := min(100, int(nRepairs/historyNodes))
	node := func(r *rand.Rand) string { return fmt.Sprintf("node-%d", r.IntN(historyNodes)) }
	timeline := func(r *rand.Rand) error {
		fs, err := s.FindingsForNode(ctx, "c1", node(r), time.Time{}, 500)
		if err == nil && len(fs) != wantTimeline {
			err = fmt.Errorf("timeline: %d findings, want %d", len(fs), wantTimeline)
		}
		return err
	}
	cases := []struct {
		name  string
		setup func(b *testing.B) // once, before the warm-up
		run   func(r *rand.Rand) error
	}{
		{"NodeTimeline", nil, timeline},
		{"NodeRepairs", nil, func(r *rand.Rand) error {
			rs, _, err := s.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: node(r), Limit: 100})
			if err == nil && len(rs) != wantRepairs {
				err = fmt.Errorf("node repairs: %d, want %d", len(rs), wantRepairs)
			}
			return err
		}},
		{"ClusterRepairs", nil, func(r *rand.Rand) error {
			_, _, err := s.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Limit: 50, Cursor: 1 + r.Int64N(nRepairs)})
			return err
		}},
		{"RepairDetail", nil, func(r *rand.Rand) error {
			id := 1 + r.Int64N(nRepairs)
			if _, err := s.GetRepair(ctx, id); err != nil {
				return err
			}
			if _, err := s.RepairAudit(ctx, id); err != nil {
				return err
			}
			fs, err := s.RepairFindings(ctx, id)
			if err == nil && len(fs) != 3 {
				err = fmt.Errorf("repair %d: %d findings, want 3", id, len(fs))
			}
			return err
		}},
		// The same timeline once every closed day's partition is rewritten
		// in node-timeline order (store.CompactFindings, what the
		// controller's maintenance does to one day per pass).
		{"NodeTimelineCompacted", compactHistory(s), timeline},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if c.setup != nil {
				c.setup(b)
			}
			r := rand.New(rand.NewPCG(1, 2))
			// Warm up: each pooled connection prepares (and PostgreSQL
			// plans) the statements on first use.
			for range 50 {
				if err := c.run(r); err != nil {
					b.Fatal(err)
				}
			}
			var d []time.Duration
			for b.Loop() {
				t := time.Now()
				if err := c.run(r); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t))
			}
			slices.Sort(d)
			q := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
			b.ReportMetric(q(0.50), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
		})
	}
}

// compactHistory returns a setup that rewrites every closed partition of
// the history data set once per test binary and logs the time it took and
// the node timeline's plan after it.
func compactHistory(s *store.Store) func(b *testing.B) {
	var once sync.Once
	return func(b *testing.B) {
		once.Do(func() {
			t := time.Now()
			done, err := s.CompactFindings(context.Background(), historyEnd, time.Time{}, historyDays+1)
			if err != nil {
				b.Fatalf("compact: %v", err)
			}
			b.Logf("compacted %d partitions in %v", len(done), time.Since(t).Round(time.Millisecond))
			logPlan(b, s, "node timeline after compaction (FindingsForNode, newest 500)", store.SQLFindingsForNode, "c1", "node-42", time.Time{}, 500)
		})
	}
}
