package ui_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/ui"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkPages renders the fleet and approvals pages of a large fleet:
// BENCH_NODES nodes (default 10,000) in 10 NodePools and 3 zones, each with
// BENCH_FINDINGS_PER_NODE findings (default 10), BENCH_HELD repairs awaiting
// approval (default 1,000) and BENCH_CLOSED replaced ones (default 2,000).
// It reports the p95 of the renders besides the mean. The scale
// (1,000,000 findings, 100,000 repairs):
//
//	BENCH_NODES=10000 BENCH_FINDINGS_PER_NODE=100 BENCH_HELD=1000 BENCH_CLOSED=99000 \
//	  go test -run '^$' -bench BenchmarkPages -benchtime 20x -timeout 25m ./web/ui/
func BenchmarkPages(b *testing.B) {
	ctx := context.Background()
	st, err := store.Open(ctx, pgtest.DSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	nodes, perNode := envInt("BENCH_NODES", 10000), envInt("BENCH_FINDINGS_PER_NODE", 10)
	held, closed := envInt("BENCH_HELD", 1000), envInt("BENCH_CLOSED", 2000)
	now := time.Now()
	for i := range nodes {
		name := fmt.Sprintf("gpu-%05d", i)
		if _, err := st.ReadNode(ctx, store.Node{Cluster: "c1", Name: name, NodePool: fmt.Sprintf("pool-%d", i%10),
			Zone: fmt.Sprintf("zone-%d", i%3)}, 1, now); err != nil {
			b.Fatal(err)
		}
		fs := make([]finding.Finding, perNode)
		for j := range fs {
			fs[j] = finding.Finding{ID: fmt.Sprintf("%s-%d", name, j), Detector: "xid", Xid: 31, GPUPCI: "0000:3b:00.0", Count: 1,
				Time: now.Add(-time.Duration(j) * time.Minute), Evidence: []string{"NVRM: Xid (PCI:0000:3b:00): 31, pid=1"}}
		}
		if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: name, BootID: "b",
			SentAt: now, Findings: fs, Heartbeat: &finding.Heartbeat{}}, now); err != nil {
			b.Fatal(err)
		}
	}
	open := func(i int, state ledger.State, at time.Time) store.Repair {
		rp, _, err := st.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: fmt.Sprintf("gpu-%05d", i%nodes), NodePool: fmt.Sprintf("pool-%d", i%10),
			Reason: "GPULost", FaultClass: "gpu-lost", RecommendedAction: "replace", State: state,
			Detail: map[string]any{"held_by": "action"}}, "controller", "bench", at)
		if err != nil {
			b.Fatal(err)
		}
		return rp
	}
	// The closed repairs are history: one replacement every 90 s before
	// now (100,000 of them span about 100 days), as the deletion budgets
	// allow a fleet; putting them all in the last hour would make every
	// read of the hour's budget count them.
	for i := range closed {
		at := now.Add(-time.Duration(closed-i) * 90 * time.Second)
		rp := open(held+i, ledger.Deleting, at)
		if _, err := st.Transition(ctx, store.TransitionRequest{ID: rp.ID, From: ledger.Deleting, To: ledger.Replaced, Actor: "controller", Reason: "bench"}, at.Add(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	for i := range held {
		open(i, ledger.AwaitingApproval, now)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := api.New(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Log: log})
	if err != nil {
		b.Fatal(err)
	}
	h, err := ui.Handler(ui.Config{API: svc, APIHandler: svc.Handler(), Log: log, Sessions: auth.NewSessions(st.Sessions(nil), time.Hour, time.Hour, false)})
	if err != nil {
		b.Fatal(err)
	}
	op := auth.Operator{Name: "bench", Role: auth.RoleApprover}
	// The reads alone, to tell the database's share from the rendering's.
	reads := map[string]func() error{
		"read-fleet":     func() error { _, err := svc.Fleet(ctx); return err },
		"read-nodes":     func() error { _, err := svc.Nodes(ctx, api.NodeQuery{Health: "attention", Limit: 50}); return err },
		"read-approvals": func() error { _, err := svc.Approvals(ctx); return err },
	}
	for _, name := range []string{"read-fleet", "read-nodes", "read-approvals"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if err := reads[name](); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, path := range []string{"/fleet", "/approvals"} {
		b.Run(path[1:], func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, path, nil).WithContext(auth.WithOperator(ctx, op))
				w := httptest.NewRecorder()
				start := time.Now()
				h.ServeHTTP(w, req)
				took = append(took, time.Since(start))
				if w.Code != http.StatusOK {
					b.Fatalf("GET %s: %d", path, w.Code)
				}
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)*95/100].Microseconds())/1000, "p95-ms")
		})
	}
}
