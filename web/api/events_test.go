package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/feed"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

func testOperators(t *testing.T) *auth.Operators {
	t.Helper()
	ops, err := auth.NewOperators([]auth.Operator{
		{Name: "vera", Role: auth.RoleViewer, TokenSHA256: auth.TokenHash("viewer-token")},
		{Name: "otto", Role: auth.RoleApprover, TokenSHA256: auth.TokenHash("approver-token")},
	})
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// TestEveryReadNeedsViewer walks the router: with operator tokens, or with
// a dashboard login, configured, every GET route answers 401 to an
// anonymous caller and lets a viewer through; only the probes and /metrics
// stay open. Without either, reads stay open.
func TestEveryReadNeedsViewer(t *testing.T) {
	t.Parallel()
	st := pgtest.Store(t)
	open := map[string]string{
		"/livez": "kubelet probe", "/readyz": "kubelet probe",
		"/metrics":             "Prometheus scrape: counters and gauges, no history",
		"/api/v1/openapi.json": "the API's description, no history",
	}
	viewer := auth.Operator{Name: "vera", Role: auth.RoleViewer}
	for _, tc := range []struct {
		name string
		cfg  api.Config
		// as makes a viewer's request: a bearer token, or a login session
		// (web/ui's session middleware puts the human in the context).
		as func(*http.Request) *http.Request
	}{
		{"operator tokens", api.Config{Operators: testOperators(t)}, func(r *http.Request) *http.Request {
			r.Header.Set("Authorization", "Bearer viewer-token")
			return r
		}},
		{"dashboard login", api.Config{Login: true}, func(r *http.Request) *http.Request {
			return r.WithContext(auth.WithOperator(r.Context(), viewer))
		}},
	} {
		cfg := tc.cfg
		cfg.Store, cfg.Catalog, cfg.Clusters = st, catalog.Default(), []string{"c1"}
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
		svc, err := api.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h := svc.Handler()
		routes, ok := h.(chi.Routes)
		if !ok {
			t.Fatalf("the API handler is %T, not a chi router: the walk cannot see its routes", h)
		}
		var reads []string
		err = chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
			if method != http.MethodGet {
				return nil
			}
			path := strings.NewReplacer("{id}", "1", "{cluster}", "c1", "{node}", "n1").Replace(route)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if why, ok := open[route]; ok {
				if rec.Code == http.StatusUnauthorized || rec.Code == http.StatusForbidden {
					t.Errorf("%s: GET %s = %d, want open (%s)", tc.name, route, rec.Code, why)
				}
				return nil
			}
			reads = append(reads, route)
			if rec.Code != http.StatusUnauthorized {
				t.Errorf("%s: anonymous GET %s = %d %s, want 401", tc.name, route, rec.Code, rec.Body)
			}
			rec = httptest.NewRecorder()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			h.ServeHTTP(rec, tc.as(httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx)))
			cancel()
			if rec.Code == http.StatusUnauthorized || rec.Code == http.StatusForbidden {
				t.Errorf("%s: viewer GET %s = %d %s, want let through", tc.name, route, rec.Code, rec.Body)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"/api/v1/repairs", "/api/v1/nodes/{cluster}/{node}", "/api/v1/fleet", "/api/v1/events", "/api/v1/shadow", "/api/v1/reasons"} {
			found := false
			for _, r := range reads {
				found = found || r == want
			}
			if !found {
				t.Errorf("%s: the walk did not find GET %s (found %v)", tc.name, want, reads)
			}
		}
	}
	// Neither configured (a test or an explicitly open setup): reads open.
	svc, err := api.New(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	svc.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/fleet", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("open setup: GET /api/v1/fleet = %d, want 200", rec.Code)
	}
}

// sse is one Server-Sent Event read from a stream.
type sse struct {
	ID, Event string
	Data      string
}

// readSSE parses a text/event-stream body into events on a channel
// (closed at the end of the stream).
func readSSE(body io.Reader) <-chan sse {
	out := make(chan sse, 64)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Event != "" || ev.Data != "" {
					out <- ev
				}
				ev = sse{}
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.Event = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.Data += line[6:]
			}
		}
	}()
	return out
}

type streamEnv struct {
	st  *store.Store
	srv *httptest.Server
}

func newStreamEnv(t *testing.T) *streamEnv {
	t.Helper()
	st := pgtest.Store(t)
	hub, err := feed.New(feed.Config{Source: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = hub.Run(ctx) }()
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Operators: testOperators(t), Feed: hub,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close(); cancel(); <-done })
	return &streamEnv{st: st, srv: srv}
}

// stream opens GET /api/v1/events as the viewer; lastID "" starts live.
// It retries while the feed starts (503).
func (e *streamEnv) stream(t *testing.T, lastID string) <-chan sse {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/api/v1/events", nil)
		req.Header.Set("Authorization", "Bearer viewer-token")
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusServiceUnavailable && time.Now().Before(deadline) {
			resp.Body.Close()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("GET /api/v1/events = %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return readSSE(resp.Body)
	}
}

func nextSSE(t *testing.T, c <-chan sse) sse {
	t.Helper()
	select {
	case ev, ok := <-c:
		if !ok {
			t.Fatal("stream ended")
		}
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30s")
	}
	return sse{}
}

func openHeld(t *testing.T, st *store.Store, node string) store.Repair {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	r, _, err := st.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: node, NodeClaim: "claim-" + node, NodePool: "gpu",
		Reason: "GPUFallenOffBus", RecommendedAction: "replace"}, "controller", "diagnosis", now)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The stream needs a viewer, delivers a repair transition as a typed event
// with its JSON, and a reconnect with Last-Event-ID replays what came after
// it; an id older than the retained events gets a reset.
func TestEventStream(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	resp, err := http.Get(e.srv.URL + "/api/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous stream: %d, want 401", resp.StatusCode)
	}

	live := e.stream(t, "")
	r := openHeld(t, e.st, "n1")
	ev := nextSSE(t, live)
	var got store.Event
	if err := json.Unmarshal([]byte(ev.Data), &got); err != nil {
		t.Fatalf("event data %q: %v", ev.Data, err)
	}
	var data struct {
		RepairID int64  `json:"repairId"`
		To       string `json:"to"`
		Actor    string `json:"actor"`
	}
	if err := json.Unmarshal(got.Data, &data); err != nil {
		t.Fatal(err)
	}
	if ev.Event != "repair" || ev.ID != strconv.FormatInt(got.ID, 10) || data.RepairID != r.ID || data.To != "detected" || got.Node != "n1" {
		t.Fatalf("event %+v (data %+v), want the repair's opening", ev, data)
	}
	if _, err := e.st.Transition(context.Background(), store.TransitionRequest{ID: r.ID, From: ledger.Detected, To: ledger.Quarantined,
		Actor: "controller", Reason: "cordon"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	second := nextSSE(t, live)
	if second.Event != "repair" || !strings.Contains(second.Data, `"to": "quarantined"`) && !strings.Contains(second.Data, `"to":"quarantined"`) {
		t.Fatalf("second event %+v, want the quarantine", second)
	}

	// Reconnect from the first: the quarantine is replayed, then live.
	resumed := e.stream(t, ev.ID)
	if re := nextSSE(t, resumed); re.ID != second.ID {
		t.Fatalf("resume from %s replayed %+v, want event %s", ev.ID, re, second.ID)
	}
	openHeld(t, e.st, "n2")
	if re := nextSSE(t, resumed); re.Event != "repair" || !strings.Contains(re.Data, "n2") {
		t.Fatalf("after the replay: %+v, want n2's opening", re)
	}

	// Retention pruned everything: resuming from the first is a reset.
	if _, err := e.st.DeleteEventsBefore(context.Background(), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	reset := nextSSE(t, e.stream(t, ev.ID))
	var rv api.ResetEvent
	if err := json.Unmarshal([]byte(reset.Data), &rv); reset.Event != "reset" || err != nil || rv.Reason == "" {
		t.Fatalf("resume from a pruned id: %+v (%v), want a reset with its reason", reset, err)
	}
}

// A client resuming with a Last-Event-ID past every stored event (its id
// is from a database since restored) gets a reset that says so and then
// the live events, instead of a stream that waits for ids never written.
func TestEventStreamAheadOfTheDatabase(t *testing.T) {
	t.Parallel()
	e := newStreamEnv(t)
	live := e.stream(t, "")
	openHeld(t, e.st, "n1")
	first := nextSSE(t, live)
	id, err := strconv.ParseInt(first.ID, 10, 64)
	if err != nil {
		t.Fatalf("event id %q: %v", first.ID, err)
	}
	ahead := e.stream(t, strconv.FormatInt(id+146, 10))
	reset := nextSSE(t, ahead)
	var rv api.ResetEvent
	if err := json.Unmarshal([]byte(reset.Data), &rv); reset.Event != "reset" || err != nil || !strings.Contains(rv.Reason, "ahead of the newest stored event") || rv.Position != id {
		t.Fatalf("resume from %d: %+v (%v), want a reset from %d saying the id is ahead", id+146, reset, err, id)
	}
	openHeld(t, e.st, "n2")
	if next := nextSSE(t, ahead); next.Event != "repair" || !strings.Contains(next.Data, "n2") {
		t.Fatalf("after the reset: %+v, want n2's opening", next)
	}
}
