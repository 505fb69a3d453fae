package ui_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/feed"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/ui"
)

// replica is one controller replica's web side: its own store pool, live
// feed (LISTEN on its own connection), API and dashboard.
type replica struct {
	st  *store.Store
	srv *httptest.Server
}

// newReplica serves the dashboard (demo login) and the API (operator
// tokens, so reads need a viewer) on the database at dsn.
func newReplica(t *testing.T, dsn string, ops *auth.Operators) *replica {
	t.Helper()
	st, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	hub, err := feed.New(feed.Config{Source: st, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = hub.Run(ctx) }()
	svc, err := api.New(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Operators: ops, Login: true, Feed: hub, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.Handler(ui.Config{API: svc, APIHandler: svc.Handler(), DevLogin: true, Log: log,
		Sessions: auth.NewSessions(st.Sessions(nil), time.Hour, time.Hour, false)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close(); cancel(); <-done; st.Close() })
	return &replica{st: st, srv: srv}
}

// TestLiveAcrossReplicas: a viewer's repair page and approvals page on
// replica B show, without a reload, an approval an approver made through
// replica A's API: the decision reaches B through PostgreSQL
// (LISTEN/NOTIFY and the events table), B's stream, and the page's
// EventSource; a stream dropped by B resumes with Last-Event-ID and
// replays the approval made meanwhile. The stream itself refuses a browser
// that is not logged in.
func TestLiveAcrossReplicas(t *testing.T) {
	dsn := pgtest.DSN(t)
	ops, err := auth.NewOperators([]auth.Operator{{Name: "otto", Role: auth.RoleApprover, TokenSHA256: auth.TokenHash("approver-token")}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := newReplica(t, dsn, ops), newReplica(t, dsn, ops)
	ctx := context.Background()
	now := time.Now().UTC()
	var held []int64
	for _, n := range []string{"gpu-1", "gpu-2", "gpu-3"} {
		if _, err := a.st.ReadNode(ctx, store.Node{Cluster: "c1", Name: n, NodePool: "gpu", Zone: "us-east-1c", NodeClaim: "nc-" + n}, 1, now); err != nil {
			t.Fatal(err)
		}
		rp, _, err := a.st.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: n, NodeClaim: "nc-" + n, NodeClaimUID: "uid-" + n, NodePool: "gpu",
			Reason: "GPULost", FaultClass: "accelerated-hardware", RecommendedAction: "reboot", State: ledger.AwaitingApproval,
			Detail: map[string]any{"held_by": "action"}}, "controller", "reboot is not executable here", now)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, rp.ID)
	}

	bctx := newBrowser(t)
	// Not logged in: the stream is refused (401), the page is a login.
	do(t, bctx, chromedp.Navigate(b.srv.URL+"/login"), chromedp.WaitVisible("#dev-login"))
	status, err := chromedp.Run(bctx, chromedp.Evaluate[int](`fetch("/api/v1/events").then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil || status != http.StatusUnauthorized {
		t.Fatalf("stream before login: %d, %v; want 401", status, err)
	}
	do(t, bctx, chromedp.SetValue(`input[name=name]`, "vera"), chromedp.SetValue(`select[name=role]`, "viewer"),
		chromedp.Click("#dev-login"), chromedp.WaitVisible("#who"))

	approve := func(id int64, reason string) time.Time {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/api/v1/repairs/%d/approve", a.srv.URL, id), strings.NewReader(`{"reason":"`+reason+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer approver-token")
		at := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("approve %d on replica A: %d", id, resp.StatusCode)
		}
		return at
	}
	// waitLive waits for the page to show cond without a reload, and logs
	// how long the change took to appear.
	waitLive := func(what, cond string, since time.Time) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`(`+cond+`) && window.notReloaded === 1`,
			chromedp.WithPollingTimeout(15*time.Second), chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
			t.Fatalf("%s: the page on replica B did not show replica A's approval without a reload: %v; the page:\n%s", what, err, dump(bctx))
		}
		t.Logf("%s: replica A's approval shown on replica B's open page after %s", what, time.Since(since).Round(time.Millisecond))
	}
	streaming := func() {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Evaluate[int](`window.notReloaded = 1`)); err != nil {
			t.Fatal(err)
		}
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("stream").textContent === "live"`, chromedp.WithPollingTimeout(15*time.Second))); err != nil {
			t.Fatalf("the page's stream did not open: %v; the page:\n%s", err, dump(bctx))
		}
	}

	do(t, bctx, chromedp.Navigate(fmt.Sprintf("%s/repairs/%d", b.srv.URL, held[0])), chromedp.WaitVisible("#repair-state"))
	if got := text(t, bctx, "#repair-state"); got != string(ledger.AwaitingApproval) {
		t.Fatalf("repair page shows %q, want awaiting_approval", got)
	}
	streaming()
	at := approve(held[0], "checked the node by hand")
	waitLive("repair page", `document.getElementById("repair-state").innerText.trim() === "approved"`, at)
	if !strings.Contains(text(t, bctx, "#timeline"), "user:otto") {
		t.Errorf("the timeline does not name the approver: %s", text(t, bctx, "#timeline"))
	}

	do(t, bctx, chromedp.Navigate(b.srv.URL+"/approvals"), chromedp.WaitVisible(fmt.Sprintf(`tr.held[data-repair="%d"]`, held[1])))
	streaming()
	at = approve(held[1], "second one")
	waitLive("approvals page", fmt.Sprintf(`!document.querySelector('tr.held[data-repair="%d"]')`, held[1]), at)

	// Replica B drops the page's stream; the approval made meanwhile on A
	// reaches the page when EventSource reconnects with its Last-Event-ID
	// (the replay), not by a re-read of its own (30 s away).
	do(t, bctx, chromedp.WaitVisible(fmt.Sprintf(`tr.held[data-repair="%d"]`, held[2])))
	streaming()
	b.srv.CloseClientConnections()
	at = approve(held[2], "while the stream was down")
	waitLive("approvals page after a reconnect", fmt.Sprintf(`!document.querySelector('tr.held[data-repair="%d"]')`, held[2]), at)
}
