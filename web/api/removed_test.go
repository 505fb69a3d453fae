package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// A node whose Kubernetes Node is gone (store.MarkNodeRemoved) is out of
// GET /api/v1/fleet and GET /api/v1/nodes (?health=attention included),
// listed with ?includeRemoved=true, and its page says when it went.
func TestRemovedNodesOutOfTheFleet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	now := time.Now()
	for _, n := range []string{"n1", "n2"} {
		if _, err := e.st.ReadNode(ctx, store.Node{Cluster: "c1", Name: n, NodePool: "gpu"}, 1, now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: n, BootID: "b"}, now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.st.MarkNodeRemoved(ctx, "c1", "n2", now.Add(-30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(e.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	var fleet api.Fleet
	get("/api/v1/fleet", &fleet)
	if len(fleet.Clusters) != 1 || fleet.Clusters[0].Nodes != 1 || fleet.Clusters[0].Unknown != 1 {
		t.Fatalf("fleet %+v: want 1 node (n1, silent), the removed n2 not counted", fleet.Clusters)
	}
	for path, want := range map[string]int{"/api/v1/nodes?health=attention": 1, "/api/v1/nodes": 1, "/api/v1/nodes?includeRemoved=true": 2} {
		var l api.NodeList
		get(path, &l)
		if len(l.Items) != want {
			t.Errorf("%s: %d nodes %+v, want %d", path, len(l.Items), l.Items, want)
		}
	}
	var d api.NodeDetail
	get("/api/v1/nodes/c1/n2", &d)
	if d.Node.RemovedAt == nil || d.Health != api.HealthUnknown {
		t.Fatalf("removed node page: %+v, want removedAt set", d)
	}
	resp, err := http.Get(e.srv.URL + "/api/v1/nodes?includeRemoved=maybe")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("includeRemoved=maybe: %d, want 400", resp.StatusCode)
	}
}
