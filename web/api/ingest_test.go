package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtemp"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestIngestTriggersOnlyOnChange: the reconciler is asked to look at a node
// when a report inserted findings or changed the node's facts, not for a
// heartbeat that changes nothing nor for a resent report.
func TestIngestTriggersOnlyOnChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hb := func(state string, fs ...finding.Finding) string {
		r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "n1", BootID: "b1", SentAt: time.Now(),
			Findings: fs, Heartbeat: &finding.Heartbeat{DriverVersion: "570.1", GPUCount: 8,
				Monitors: []finding.MonitorState{{Name: "kmsg", State: state, Since: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)}}}}
		b, _ := json.Marshal(r)
		return string(b)
	}
	steps := []struct {
		name    string
		body    string
		trigger bool
	}{
		{"first heartbeat (new node)", hb(finding.StateOK), true},
		{"same heartbeat", hb(finding.StateOK), false},
		{"same heartbeat again", hb(finding.StateOK), false},
		{"a monitor changed state", hb(finding.StateFailing), true},
		{"unchanged, with a new finding", hb(finding.StateFailing, xid("f1", 79)), true},
		{"the same report resent", hb(finding.StateFailing, xid("f1", 79)), false},
	}
	for _, s := range steps {
		before := len(e.triggered)
		if code, eb := e.post(t, s.body); code != http.StatusOK {
			t.Fatalf("%s: %d %+v", s.name, code, eb)
		}
		if got := len(e.triggered) > before; got != s.trigger {
			t.Errorf("%s: triggered = %v, want %v", s.name, got, s.trigger)
		}
	}
}

// TestIngestCollidingIDFromAnotherNode: finding IDs are scoped by node; a
// second node's finding with an ID another node used is stored, answered
// inserted 1, and reaches the reconciler.
func TestIngestCollidingIDFromAnotherNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, node := range []string{"n1", "n2"} {
		var got api.IngestResponse
		code := e.postJSON(t, report(node, xid("same-id", 79)), &got)
		if code != http.StatusOK || got.Inserted != 1 {
			t.Fatalf("%s: %d %+v, want inserted 1", node, code, got)
		}
	}
	for _, node := range []string{"n1", "n2"} {
		fs, err := e.st.FindingsForNode(context.Background(), "c1", node, time.Time{}, 0)
		if err != nil || len(fs) != 1 || fs[0].Node != node {
			t.Fatalf("findings of %s = %+v, %v", node, fs, err)
		}
	}
	if strings.Join(e.triggered, ",") != "c1/n1,c1/n2" {
		t.Errorf("triggered %v, want both nodes", e.triggered)
	}
}

func (e *env) postJSON(t *testing.T, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/api/v1/reports", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(out)
	return resp.StatusCode
}

// outageEnv is a controller API on a PostgreSQL server of its own, which a
// test may halt and restart.
type outageEnv struct {
	pg    *pgtemp.Server
	st    *store.Store
	srv   *httptest.Server
	codes sync.Map // status code -> *atomic.Int64, every answer of the ingest route
	ra    sync.Map // status code -> Retry-After seen with it
}

func newOutageEnv(t *testing.T, cfg api.Config) *outageEnv {
	t.Helper()
	ctx := context.Background()
	pg, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		t.Fatalf("start a PostgreSQL server of the test's own (install the server binaries, see test/pgtemp): %v", err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	if err := store.Migrate(ctx, pg.DSN(""), store.MigrateUp, nil); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cfg.Store, cfg.Catalog, cfg.Clusters = st, catalog.Default(), []string{"c1"}
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := api.Handler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := &outageEnv{pg: pg, st: st}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if r.URL.Path == "/api/v1/reports" {
			n, _ := o.codes.LoadOrStore(rec.code, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			o.ra.Store(rec.code, w.Header().Get("Retry-After"))
		}
	}))
	t.Cleanup(o.srv.Close)
	return o
}

func (o *outageEnv) count(code int) int64 {
	n, ok := o.codes.Load(code)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (o *outageEnv) post(t *testing.T, body string) (*http.Response, api.ErrorBody) {
	t.Helper()
	resp, err := http.Post(o.srv.URL+"/api/v1/reports", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	return resp, eb
}

// TestIngestDatabaseDown: with PostgreSQL stopped, a report is answered 503
// with Retry-After (never 500, never the database's text); once it is back,
// the same report is stored.
func TestIngestDatabaseDown(t *testing.T) {
	t.Parallel()
	o := newOutageEnv(t, api.Config{})
	if err := o.pg.Halt(); err != nil {
		t.Fatal(err)
	}
	resp, eb := o.post(t, report("n1", xid("f1", 79)))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != fmt.Sprint(api.RetryAfterUnavailable) {
		t.Fatalf("database down: %d Retry-After %q %+v; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), eb)
	}
	if strings.Contains(eb.Detail+eb.Message, "dial") || strings.Contains(eb.Detail+eb.Message, "127.0.0.1") {
		t.Errorf("the answer carries the driver's error: %+v", eb)
	}
	if err := o.pg.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A pooled connection from before the stop fails once (503 again); the
	// agent resends, and so does this test.
	for range 5 {
		if resp, eb = o.post(t, report("n1", xid("f1", 79))); resp.StatusCode != http.StatusServiceUnavailable {
			break
		}
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("database back: %d %+v", resp.StatusCode, eb)
	}
}

// TestIngestOverloaded: reports beyond MaxIngestInFlight are answered 429

// TestIngestTimeoutUnderAgentTimeout: the controller gives up on a slow
// write (503 with Retry-After) before the agent gives up on the request, so
// a slow database is answered, not timed out (an agent that times out
// resends without waiting).
func TestIngestTimeoutUnderAgentTimeout(t *testing.T) {
	if api.DefaultIngestTimeout >= uplink.DefaultRequestTimeout {
		t.Fatalf("api.DefaultIngestTimeout %s, uplink.DefaultRequestTimeout %s: the controller's must be the shorter",
			api.DefaultIngestTimeout, uplink.DefaultRequestTimeout)
	}
}

// with Retry-After at once (nothing stored), and a write slower than
// IngestTimeout 503 (its resend stores it exactly once).
func TestIngestOverloaded(t *testing.T) {
	t.Parallel()
	o := newOutageEnv(t, api.Config{MaxIngestInFlight: 1, IngestTimeout: 3 * time.Second})
	ctx := context.Background()
	// Hold node n1's ingest lock (store.IngestReport's first statement), so
	// a report of n1 waits in the database.
	conn, err := pgx.Connect(ctx, o.pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('c1/n1', 0))`); err != nil {
		t.Fatal(err)
	}
	slow := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post(o.srv.URL+"/api/v1/reports", "application/json", strings.NewReader(report("n1", xid("f1", 79))))
		if err != nil {
			slow <- nil
			return
		}
		resp.Body.Close()
		slow <- resp
	}()
	// Once the slow report waits for the lock it holds the one slot.
	for waiting := 0; waiting == 0; time.Sleep(10 * time.Millisecond) {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	resp, _ := o.post(t, report("n2", xid("f2", 79)))
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != fmt.Sprint(api.RetryAfterOverloaded) {
		t.Fatalf("second report while one is in flight: %d Retry-After %q; want 429", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if r := <-slow; r == nil || r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("report slower than IngestTimeout: %+v; want 503 with Retry-After", r)
	}
	_ = tx.Rollback(ctx)
	// The refused report stored nothing; the timed-out one may have been
	// committed after all (the cancel races the lock's release): its resend
	// either stores it or is recognised, and it is stored exactly once.
	if fs, err := o.st.FindingsForNode(ctx, "c1", "n2", time.Time{}, 0); err != nil || len(fs) != 0 {
		t.Errorf("n2: stored %d findings of a report answered 429, %v", len(fs), err)
	}
	if resp, eb := o.post(t, report("n1", xid("f1", 79))); resp.StatusCode != http.StatusOK {
		t.Fatalf("resend of the timed-out report: %d %+v", resp.StatusCode, eb)
	}
	if fs, err := o.st.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0); err != nil || len(fs) != 1 {
		t.Errorf("n1 after the resend: %d findings, %v; want exactly 1", len(fs), err)
	}
}

// TestAgentAcrossDatabaseOutage runs a real agent uplink against the API
// while PostgreSQL is stopped for a while and started again: the controller
// answers 503 with Retry-After meanwhile (never 500), the agent keeps
// queueing what it observes and resends, and every finding it was given is
// stored exactly once when the database is back.
func TestAgentAcrossDatabaseOutage(t *testing.T) {
	t.Parallel()
	o := newOutageEnv(t, api.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	u, err := uplink.New(uplink.Config{URL: o.srv.URL, Cluster: "c1", Node: "n1", BootID: "b1",
		FlushInterval: 50 * time.Millisecond, HeartbeatInterval: time.Second, BatchSize: 20,
		RetryInitialInterval: 50 * time.Millisecond, RetryMaxInterval: 2 * time.Second,
		SpoolDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- u.Run(ctx) }()

	const total = 300
	enqueue := func(from, to int) {
		for i := from; i < to; i++ {
			f := finding.Finding{Detector: finding.DetectorXid, Node: "n1", BootID: "b1", Xid: 31, Count: 1,
				GPUPCI: "0000:3b:00.0", Time: time.Now().UTC(), Seq: uint64(i), Evidence: []string{fmt.Sprintf("NVRM: Xid 31 #%d", i)}}
			f.ID = finding.NewID(f)
			u.Enqueue(f)
			time.Sleep(2 * time.Millisecond)
		}
	}
	stored := func() int {
		fs, err := o.st.FindingsForNode(context.Background(), "c1", "n1", time.Time{}, 0)
		if err != nil {
			return -1
		}
		return len(fs)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s (stored %d, answers 200:%d 503:%d 500:%d)", what, stored(),
					o.count(200), o.count(503), o.count(500))
			}
		}
	}

	enqueue(0, 100)
	waitFor("the first findings", func() bool { return stored() == 100 })
	if err := o.pg.Halt(); err != nil {
		t.Fatal(err)
	}
	enqueue(100, 200) // observed during the outage: queued and resent
	waitFor("a 503 during the outage", func() bool { return o.count(http.StatusServiceUnavailable) > 0 })
	if err := o.pg.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	enqueue(200, total)
	waitFor("every finding stored", func() bool { return stored() == total })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("uplink run: %v", err)
	}
	if n := o.count(http.StatusInternalServerError); n != 0 {
		t.Errorf("%d answers were 500", n)
	}
	if ra, _ := o.ra.Load(http.StatusServiceUnavailable); ra != fmt.Sprint(api.RetryAfterUnavailable) {
		t.Errorf("503 came with Retry-After %q", ra)
	}
	if got := stored(); got != total {
		t.Errorf("stored %d findings, want exactly %d (none lost, none twice)", got, total)
	}
}
