package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// fuzzServer is the API on a real PostgreSQL, without agent authentication
// and without rate limits (the fuzzer is one fast source).
func fuzzServer(f *testing.F) *httptest.Server {
	st, err := store.Open(context.Background(), pgtest.DSN(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(st.Close)
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"},
		Limits: api.Limits{SourceRPS: -1, AgentRPS: -1, VerifyRPS: -1}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	srv := httptest.NewServer(h)
	f.Cleanup(srv.Close)
	return srv
}

// FuzzIngest posts arbitrary bodies to POST /api/v1/reports on a real
// PostgreSQL: the answer is never a 5xx (bad input is a 4xx with the
// envelope, never a database error), and never echoes PostgreSQL's text.
func FuzzIngest(f *testing.F) {
	srv := fuzzServer(f)
	f.Add(report("n1", xid("a", 79)))
	f.Add(strings.Replace(report("n1", xid("a", 79)), `"line"`, `"a\u0000b"`, 1))
	f.Add(`{"schemaVersion":"fleetrepair.dev/v1","cluster":"c1","node":"n1","bootID":"b","sentAt":"9999-12-31T00:00:00Z","findings":[],"heartbeat":{"driverVersion":"\u0000","monitors":[{"name":"x","state":"ok"}]}}`)
	f.Add(`{"schemaVersion":"fleetrepair.dev/v1","cluster":"c1","node":"n\u202e1","bootID":"b","findings":[]}`)
	f.Fuzz(func(t *testing.T, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v1/reports", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 || strings.Contains(string(b), "SQLSTATE") {
			t.Fatalf("%d %s for %q", resp.StatusCode, b, body)
		}
	})
}

// FuzzRepairsQuery sends arbitrary query strings to GET /api/v1/repairs:
// a bad parameter is a 400 naming it, never a 5xx.
func FuzzRepairsQuery(f *testing.F) {
	srv := fuzzServer(f)
	for _, q := range []string{"", "limit=10", "since=2026-11-30T12:00:00Z&until=2026-11-29T00:00:00Z", "cursor=-1", "state=nope",
		"reason=%00", "limit=99999999999999999999", "cluster=%E2%80%AEc1&node=..%2F.."} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		vals, err := url.ParseQuery(q)
		if err != nil {
			return
		}
		resp, err := http.Get(srv.URL + "/api/v1/repairs?" + vals.Encode())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("%d %s for %q", resp.StatusCode, b, q)
		}
	})
}
