package api_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestTrustedProxies: X-Forwarded-For decides the per-source limit's key
// only for a request whose TCP peer is a trusted proxy; from any other peer
// the header is ignored, so a client cannot pick its own key. A prefix
// that does not parse stops the handler from being built.
func TestTrustedProxies(t *testing.T) {
	st := pgtest.Store(t)
	get := func(t *testing.T, url, xff string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url+"/api/v1/reasons", nil)
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	serve := func(t *testing.T, proxies ...string) string {
		h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"},
			Limits: api.Limits{SourceRPS: 2, TrustedProxies: proxies}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	t.Run("trusted peer", func(t *testing.T) {
		u := serve(t, "127.0.0.0/8", "::1/128")
		for _, c := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3", "198.51.100.7, 203.0.113.4"} {
			if code, body := get(t, u, c); code != http.StatusOK {
				t.Fatalf("client %s behind the proxy: %d %s, want 200 (each client has its own limit)", c, code, body)
			}
		}
		get(t, u, "203.0.113.9")
		get(t, u, "203.0.113.9")
		code, body := get(t, u, "203.0.113.9")
		if code != http.StatusTooManyRequests || !strings.Contains(body, "203.0.113.9") {
			t.Fatalf("third request of one client in a second: %d %s, want 429 naming 203.0.113.9", code, body)
		}
	})
	t.Run("untrusted peer", func(t *testing.T) {
		u := serve(t, "10.0.0.0/8")
		var code int
		var body string
		for _, c := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"} {
			code, body = get(t, u, c)
		}
		if code != http.StatusTooManyRequests || strings.Contains(body, "203.0.113") {
			t.Fatalf("third request from one untrusted peer with forged X-Forwarded-For: %d %s, want 429 keyed on the peer", code, body)
		}
	})
	t.Run("bad prefix", func(t *testing.T) {
		_, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"},
			Limits: api.Limits{TrustedProxies: []string{"10.0.0.0/33"}}})
		if err == nil || !strings.Contains(err.Error(), "10.0.0.0/33") {
			t.Fatalf("bad prefix: %v, want an error naming it", err)
		}
	})
}
