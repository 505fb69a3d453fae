package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/web/api"
)

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
	return resp.StatusCode
}

// seedFleet stores 7 nodes of cluster c1: n0..n4 report now (n1 with an
// active GPULost diagnosis and a repair awaiting approval), n5 never
// reported, n6 was last heard from an hour ago.
func seedFleet(t *testing.T, st *store.Store) {
	t.Helper()
	ctx, now := context.Background(), time.Now()
	for i := range 7 {
		name := fmt.Sprintf("n%d", i)
		if _, err := st.ReadNode(ctx, store.Node{Cluster: "c1", Name: name, NodePool: "gpu", Zone: "z1"}, 1, now); err != nil {
			t.Fatal(err)
		}
		seen := now
		switch i {
		case 5:
			continue
		case 6:
			seen = now.Add(-time.Hour)
		}
		if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: name, BootID: "b",
			SentAt: seen, Heartbeat: &finding.Heartbeat{}}, seen); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1", Diagnoses: []store.DiagnosisRecord{{Cluster: "c1", Node: "n1", BootID: "b",
		Reason: "GPULost", Severity: "condition", FaultClass: "gpu-lost", Action: "replace", FirstSeen: now, LastSeen: now, Active: true}}}, now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: "n1", NodePool: "gpu", Reason: "GPULost", FaultClass: "gpu-lost",
		RecommendedAction: "reset-gpu", State: ledger.AwaitingApproval, Detail: map[string]any{"held_by": "action"}}, "controller", "held", now); err != nil {
		t.Fatal(err)
	}
}

func TestNodesFiltersAndKeysetPages(t *testing.T) {
	e := newEnv(t)
	seedFleet(t, e.st)

	var page api.NodeList
	var all []string
	url := e.srv.URL + "/api/v1/nodes?limit=3"
	for pages := 0; ; pages++ {
		if code := getJSON(t, url, &page); code != http.StatusOK {
			t.Fatalf("GET %s: %d", url, code)
		}
		for _, it := range page.Items {
			all = append(all, it.Name+"="+it.Health)
		}
		if page.NextCursor == "" {
			break
		}
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		url = e.srv.URL + "/api/v1/nodes?limit=3&cursor=" + page.NextCursor
		page = api.NodeList{}
	}
	want := "[n0=ok n1=failing n2=ok n3=ok n4=ok n5=unknown n6=unknown]"
	if fmt.Sprint(all) != want {
		t.Fatalf("nodes over pages of 3: %v, want %s", all, want)
	}

	for q, want := range map[string]string{
		"health=failing":   "[n1]",
		"health=unknown":   "[n5 n6]",
		"health=attention": "[n1 n5 n6]",
		"q=N6":             "[n6]",
		"cluster=other":    "[]",
	} {
		var p api.NodeList
		if code := getJSON(t, e.srv.URL+"/api/v1/nodes?"+q, &p); code != http.StatusOK {
			t.Fatalf("%s: %d", q, code)
		}
		var names []string
		for _, it := range p.Items {
			names = append(names, it.Name)
		}
		if got := fmt.Sprint(names); got != want && !(want == "[]" && names == nil) {
			t.Errorf("%s: %v, want %s", q, names, want)
		}
	}
	for _, q := range []string{"health=sick", "cursor=bm90LWEtY3Vyc29y", "limit=0", "limit=100000"} {
		var eb api.ErrorBody
		if code := getJSON(t, e.srv.URL+"/api/v1/nodes?"+q, &eb); code != http.StatusBadRequest || len(eb.Validations) == 0 {
			t.Errorf("%s: %d %+v, want 400 with validations", q, code, eb)
		}
	}
}

func TestFleetAndApprovals(t *testing.T) {
	e := newEnv(t)
	seedFleet(t, e.st)
	var f api.Fleet
	if code := getJSON(t, e.srv.URL+"/api/v1/fleet", &f); code != http.StatusOK || len(f.Clusters) != 1 {
		t.Fatalf("fleet: %d %+v", code, f)
	}
	c := f.Clusters[0]
	if c.Nodes != 7 || c.Failing != 1 || c.Unknown != 2 || len(c.NodePools) != 1 || c.NodePools[0].OK != 4 || c.NodePools[0].AwaitingApproval != 1 ||
		f.AwaitingApproval != 1 || c.DeletionsPerHour == 0 || c.DeletionsLeft != c.DeletionsPerHour {
		t.Fatalf("fleet cluster %+v (awaiting %d)", c, f.AwaitingApproval)
	}
	var a api.Approvals
	if code := getJSON(t, e.srv.URL+"/api/v1/approvals", &a); code != http.StatusOK {
		t.Fatalf("approvals: %d", code)
	}
	if a.Total != 1 || len(a.Groups) != 1 || a.Groups[0].HeldBy != "action" || len(a.Groups[0].Repairs) != 1 ||
		a.Groups[0].Repairs[0].Node != "n1" || a.Groups[0].Repairs[0].HeldSince.IsZero() ||
		!a.Groups[0].Repairs[0].ExpiresAt.After(a.Groups[0].Repairs[0].HeldSince) {
		t.Fatalf("approvals %+v", a)
	}
}

func TestStats(t *testing.T) {
	e := newEnv(t)
	seedFleet(t, e.st)
	ctx, now := context.Background(), time.Now()
	rp, _, err := e.st.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: "n2", NodePool: "gpu", Reason: "GPULost", FaultClass: "gpu-lost",
		RecommendedAction: "replace", State: ledger.Deleting}, "controller", "bench", now.Add(-10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Transition(ctx, store.TransitionRequest{ID: rp.ID, From: ledger.Deleting, To: ledger.Replaced, Actor: "controller", Reason: "gone"}, now); err != nil {
		t.Fatal(err)
	}
	var st api.Stats
	if code := getJSON(t, e.srv.URL+"/api/v1/stats?days=7", &st); code != http.StatusOK {
		t.Fatalf("stats: %d", code)
	}
	if len(st.Days) != 7 || st.Days[6] != now.UTC().Format("2006-01-02") || len(st.Reasons) != 1 {
		t.Fatalf("stats %+v", st)
	}
	r := st.Reasons[0]
	if r.Reason != "GPULost" || r.PerDay[6] != 2 || r.Replaced != 1 || r.P50Seconds < 599 || r.P50Seconds > 601 || r.P90Seconds != r.P50Seconds {
		t.Fatalf("GPULost stats %+v", r)
	}
	var eb api.ErrorBody
	if code := getJSON(t, e.srv.URL+"/api/v1/stats?days=0", &eb); code != http.StatusBadRequest {
		t.Fatalf("days=0: %d", code)
	}
}
