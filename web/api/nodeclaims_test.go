package api_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestNodeClaims: GET /api/v1/clusters/{cluster}/nodeclaims lists the last
// pass's classification, filtered by ?state=stuck or named states, with
// every state counted; the fleet summary carries the counts and the stuck
// ones; unknown clusters, bad states and clusters not listed yet say so.
func TestNodeClaims(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	claims := []lifecycle.Claim{
		{Cluster: "c1", Name: "a-nc", Node: "a", State: lifecycle.StateStuckTerminating, Stuck: true, Detail: "deletion pending 7d 2h"},
		{Cluster: "c1", Name: "g-nc", State: lifecycle.StateNotRegistered, Stuck: true},
		{Cluster: "c1", Name: "b-nc", Node: "b", State: lifecycle.StateActive},
		{Cluster: "c1", Name: "d-nc", Node: "d", State: lifecycle.StateDrifted},
	}
	h, err := api.Handler(api.Config{Store: pgtest.Store(t), Catalog: catalog.Default(), Clusters: []string{"c1", "c2"},
		NodeClaims: func(c string) ([]lifecycle.Claim, time.Time, bool) {
			if c != "c1" {
				return nil, time.Time{}, false
			}
			return claims, at, true
		}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	names := func(l api.NodeClaimList) []string {
		var out []string
		for _, c := range l.Items {
			out = append(out, c.Name)
		}
		return out
	}
	for _, tt := range []struct {
		query string
		want  []string
	}{
		{"", []string{"a-nc", "g-nc", "b-nc", "d-nc"}},
		{"?state=stuck", []string{"a-nc", "g-nc"}},
		{"?state=drifted,active", []string{"b-nc", "d-nc"}},
	} {
		var l api.NodeClaimList
		if code := getJSON(t, srv.URL+"/api/v1/clusters/c1/nodeclaims"+tt.query, &l); code != http.StatusOK {
			t.Fatalf("%s: %d", tt.query, code)
		}
		if got := names(l); len(got) != len(tt.want) || !l.EvaluatedAt.Equal(at) || l.Counts[lifecycle.StateStuckTerminating] != 1 ||
			len(l.Counts) != len(lifecycle.States()) || l.Counts[lifecycle.StateNoNode] != 0 {
			t.Errorf("%s: items %v counts %v at %s, want %v", tt.query, got, l.Counts, l.EvaluatedAt, tt.want)
		} else {
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("%s: items %v, want %v", tt.query, got, tt.want)
				}
			}
		}
	}
	for path, want := range map[string]int{
		"/api/v1/clusters/c9/nodeclaims":                  http.StatusNotFound,
		"/api/v1/clusters/c1/nodeclaims?state=broken":     http.StatusBadRequest,
		"/api/v1/clusters/c2/nodeclaims":                  http.StatusServiceUnavailable,
		"/api/v1/clusters/c1/nodeclaims?state=stuck,nope": http.StatusBadRequest,
	} {
		var eb api.ErrorBody
		if code := getJSON(t, srv.URL+path, &eb); code != want || eb.Message == "" {
			t.Errorf("%s: %d %+v, want %d with a message", path, code, eb, want)
		}
	}
	var f api.Fleet
	if code := getJSON(t, srv.URL+"/api/v1/fleet", &f); code != http.StatusOK || len(f.Clusters) != 2 {
		t.Fatalf("fleet: %d %+v", code, f)
	}
	for _, c := range f.Clusters {
		switch c.Name {
		case "c1":
			if c.NodeClaims == nil || len(c.NodeClaims.Items) != 2 || c.NodeClaims.Counts[lifecycle.StateActive] != 1 {
				t.Errorf("fleet c1 nodeClaims %+v, want 2 stuck listed and the counts", c.NodeClaims)
			}
		case "c2":
			if c.NodeClaims != nil {
				t.Errorf("fleet c2 nodeClaims %+v before any pass listed it", c.NodeClaims)
			}
		}
	}
}
