package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fleet is a controller API on a real PostgreSQL with operators vera
// (viewer), otto (approver) and ada (admin), seeded with an open zone=z1
// breaker (7 of 8 nodes failing vs 1 of 20 elsewhere) holding the repairs
// of z1-0..z1-6, a repair of z2-0 held because its action is not
// executable, and a tolerating repair of z2-1: 9 repairs, opened 2h ago.
type fleet struct {
	url     string
	handler http.Handler
	st      *store.Store
	held    map[string]int64 // node -> repair id
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	st := pgtest.Store(t)
	ops, err := auth.NewOperators([]auth.Operator{
		{Name: "vera", Role: auth.RoleViewer, TokenSHA256: auth.TokenHash("viewer-token")},
		{Name: "otto", Role: auth.RoleApprover, TokenSHA256: auth.TokenHash("approver-token")},
		{Name: "ada", Role: auth.RoleAdmin, TokenSHA256: auth.TokenHash("admin-token")},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := api.New(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Operators: ops,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{handler: svc.Handler(), st: st, held: map[string]int64{}}
	srv := httptest.NewServer(f.handler)
	t.Cleanup(srv.Close)
	f.url = srv.URL

	ctx, now := context.Background(), time.Now()
	opened := now.Add(-2 * time.Hour)
	var failing []string
	for i := range 7 {
		failing = append(failing, fmt.Sprintf("c1/z1-%d", i))
	}
	for i, name := range []string{"z1-0", "z1-1", "z1-2", "z1-3", "z1-4", "z1-5", "z1-6", "z2-0", "z2-1"} {
		zone := name[:2]
		if _, err := st.ReadNode(ctx, store.Node{Cluster: "c1", Name: name, NodePool: "gpu", Zone: zone}, 1, opened); err != nil {
			t.Fatal(err)
		}
		fid := "f-" + name
		if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: name, BootID: "b1", SentAt: opened,
			Findings: []finding.Finding{{ID: fid, Detector: "xid", Xid: 79, GPUPCI: "0000:3b:00.0", Count: 1, Time: opened,
				Evidence: []string{"NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."}}}}, opened); err != nil {
			t.Fatal(err)
		}
		r := store.Repair{Cluster: "c1", Node: name, NodePool: "gpu", NodeClaim: name + "-nc", NodeClaimUID: "uid-" + name, Reason: "GPULost",
			FaultClass: "gpu-lost", RecommendedAction: "replace", State: ledger.AwaitingApproval, Detail: map[string]any{"held_by": "breaker"},
			FindingIDs: []string{fid}}
		why := "breaker zone=z1 open: 7 of 8 nodes failing"
		switch {
		case i == 7:
			r.RecommendedAction, r.Detail, why = "reset-gpu", map[string]any{"held_by": "action"}, "reset-gpu is not executable here"
		case i == 8:
			r.State, r.Detail, r.TolerationStartedAt, r.TolerationUntil, why = ledger.Tolerating, nil, opened, now.Add(time.Hour), "toleration window"
		}
		rp, _, err := st.OpenRepair(ctx, r, "controller", why, opened)
		if err != nil {
			t.Fatal(err)
		}
		f.held[name] = rp.ID
	}
	bs := breaker.State{Cohorts: map[string]breaker.Breaker{"zone=z1": {Scope: breaker.ScopeCohort, Cohort: "zone=z1", Since: opened, LastFailure: opened,
		Evidence: breaker.Evidence{At: opened, WindowSeconds: 600, CohortNodes: 8, CohortFailing: 7, RestNodes: 20, RestFailing: 1,
			PValue: 5e-5, Log10P: -4.3, Failing: failing}}}}
	doc, _ := json.Marshal(bs)
	_, v, err := st.BreakerState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SaveBreakerState(ctx, doc, v, []store.BreakerDecision{{At: opened, Scope: "cohort", Cohort: "zone=z1", From: "closed", To: "open",
		Cause: "tripped", Actor: "controller", Message: "breaker zone=z1 tripped: 7 of 8 nodes failing", Evidence: json.RawMessage(`{}`)}}, opened); err != nil {
		t.Fatal(err)
	}
	return f
}

// isolate points the client configuration at an empty home: no config
// file, no kubeconfig, no FLEETREPAIR_* variables.
func isolate(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("KUBECONFIG", filepath.Join(home, ".kube", "config"))
	for _, k := range []string{"FLEETREPAIR_SERVER", "FLEETREPAIR_TOKEN", "FLEETREPAIR_CONTEXT", "FLEETREPAIR_CLIENT_CONFIG"} {
		t.Setenv(k, "")
	}
	return home
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// cli runs the fleetrepair command line, returning stdout, stderr, error.
func cli(args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, strings.NewReader(""), &out, &errOut)
	return out.String(), errOut.String(), err
}

func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := cli(args...)
	if err != nil {
		t.Fatalf("fleetrepair %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func wantAll(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, got)
		}
	}
}

// TestCLIOnCall drives the client commands against the real API as the
// on-call would at 3 a.m.: the breakers in words, the held repairs with
// what holds them, how to approve one, the approval and rejection in the
// audit with the operator's name, the resume, and every output format.
func TestCLIOnCall(t *testing.T) {
	home := isolate(t)
	f := newFleet(t)
	writeFile(t, filepath.Join(home, "otto.token"), "approver-token\n")
	writeFile(t, filepath.Join(home, ".config", "fleetrepair", "config.yaml"), fmt.Sprintf(`current-context: prod
contexts:
  - name: prod
    server: %s
    token-file: ~/otto.token
  - name: nowhere
    server: http://127.0.0.1:1
`, f.url))

	// breakers list: the evidence in words and numbers, what it holds, how to release it.
	out := mustCLI(t, "breakers", "list")
	wantAll(t, "breakers list", out, "OPEN BREAKER", "zone=z1", "2h", "7 repairs",
		"7 of 8 nodes in zone=z1 failing vs 1 of 20 elsewhere, p=10^-4.3, window 10m0s",
		"fleetrepair breakers resume zone=z1 --reason 'WHY'", "1 repair(s) await approval not held by an open breaker",
		"Recent decisions (1 of 1)", "breaker zone=z1 tripped")
	if strings.Contains(out, "{") {
		t.Errorf("breakers list prints raw JSON:\n%s", out)
	}
	var view api.BreakerView
	if err := json.Unmarshal([]byte(mustCLI(t, "breakers", "list", "-o", "json")), &view); err != nil || view.State.Cohorts["zone=z1"].Evidence.CohortFailing != 7 {
		t.Errorf("breakers list -o json: %v %+v", err, view)
	}
	var viewY api.BreakerView
	if err := yaml.Unmarshal([]byte(mustCLI(t, "breakers", "list", "-o", "yaml")), &viewY); err != nil || viewY.State.Cohorts["zone=z1"].Evidence.RestNodes != 20 {
		t.Errorf("breakers list -o yaml: %v %+v", err, viewY)
	}
	wantAll(t, "breakers list -o wide", mustCLI(t, "breakers", "list", "-o", "wide"), "HALT-ROLLOUT", "LAST FAILURE")

	// repairs list: held-by and age, and the next page said and given.
	out = mustCLI(t, "repairs", "list", "--limit", "4")
	wantAll(t, "repairs list", out, "ID", "NODE", "STATE", "REASON", "HELD-BY", "AGE", "c1/z2-1", "tolerating", "c1/z1-6",
		"breaker zone=z1", "more repairs exist: next page with", "(or --all for every page)")
	if !regexp.MustCompile(`(?m)^\d+\s+c1/z2-0\s+awaiting_approval\s+GPULost\s+action\s+2h$`).MatchString(out) {
		t.Errorf("repairs list: no row for the action-held z2-0 with its age 2h:\n%s", out)
	}
	m := regexp.MustCompile(`fleetrepair repairs list --limit 4 --cursor (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("repairs list: no next-page command with the filters and a cursor:\n%s", out)
	}
	seen := map[string]bool{}
	rows := func(s string) []string {
		return regexp.MustCompile(`(?m)^(\d+)\s+c1/`).FindAllString(s, -1)
	}
	for _, r := range rows(out) {
		seen[r] = true
	}
	page2 := mustCLI(t, "repairs", "list", "--limit", "4", "--cursor", m[1])
	for _, r := range rows(page2) {
		if seen[r] {
			t.Errorf("page 2 repeats %q", r)
		}
		seen[r] = true
	}
	all := mustCLI(t, "repairs", "list", "--all", "--limit", "4")
	if n := len(rows(all)); n != 9 || strings.Contains(all, "more repairs exist") || len(rows(out)) != 4 || len(rows(page2)) != 4 {
		t.Errorf("pages of 4: %d, %d rows; --all %d rows (want 9, no next page):\n%s", len(rows(out)), len(rows(page2)), n, all)
	}
	wantAll(t, "repairs list -o wide", mustCLI(t, "repairs", "list", "-o", "wide", "--node", "z1-3"),
		"NODEPOOL", "NODECLAIM", "RECOMMENDED", "z1-3-nc", "replace", "IN-STATE")
	var page api.RepairPage
	stdout, stderr, err := cli("repairs", "list", "-o", "json", "--limit", "2", "--state", "awaiting_approval")
	if err != nil || json.Unmarshal([]byte(stdout), &page) != nil || len(page.Items) != 2 || page.NextCursor == "" ||
		!strings.Contains(stderr, "--state awaiting_approval --limit 2 --output json --cursor "+page.NextCursor) {
		t.Errorf("repairs list -o json: %v %+v, stderr %q", err, page, stderr)
	}
	if out := mustCLI(t, "repairs", "list", "--state", "rejected"); !strings.Contains(out, "No repairs match.") {
		t.Errorf("empty list: %q", out)
	}
	if out := mustCLI(t, "repairs", "list", "--since", "1h"); !strings.Contains(out, "No repairs match.") {
		t.Errorf("--since 1h (every repair opened 2h ago): %q", out)
	}
	if _, _, err := cli("repairs", "list", "--since", "3h", "--until", "2026-01-01T00:00:00Z"); err == nil || !strings.Contains(err.Error(), "400 Bad Request: invalid query: since: must be before until") {
		t.Errorf("an until before since: %v", err)
	}
	if n := len(rows(mustCLI(t, "repairs", "list", "--since", "3h"))); n != 9 {
		t.Errorf("--since 3h: %d repairs, want 9", n)
	}

	// nodes: health in words, the agent's silence, the open repair.
	out = mustCLI(t, "nodes", "list", "--name", "z1-")
	wantAll(t, "nodes list", out, "NODE", "HEALTH", "WHY", "AGENT SEEN", "c1/z1-0", "unknown", "2h ago", fmt.Sprintf("%d awaiting_approval", f.held["z1-0"]))
	if strings.Contains(out, "z2-") {
		t.Errorf("nodes list --name z1- lists z2 nodes:\n%s", out)
	}
	wantAll(t, "nodes list -o wide", mustCLI(t, "nodes", "list", "-o", "wide", "--limit", "1"), "NODEPOOL", "ZONE", "gpu", "z1",
		"more nodes exist: next page with", "fleetrepair nodes list --limit 1 --output wide --cursor ")
	wantAll(t, "nodes show", mustCLI(t, "nodes", "show", "c1/z1-0"), "Node c1/z1-0  unknown", "NodePool: gpu  zone: z1", "Repairs (1):", "breaker", "Findings: 1")
	if _, _, err := cli("nodes", "show", "z1-0"); err == nil || !strings.Contains(err.Error(), "want CLUSTER/NODE") {
		t.Errorf("nodes show without the cluster: %v", err)
	}

	// repairs show on a held repair says what holds it and exactly how to decide.
	id := f.held["z1-2"]
	out = mustCLI(t, "repairs", "show", fmt.Sprint(id), "--context", "prod")
	wantAll(t, "repairs show (held)", out, fmt.Sprintf("Repair %d  c1/z1-2  awaiting_approval", id),
		"AWAITING APPROVAL, held by breaker zone=z1: 7 of 8 nodes in zone=z1 failing vs 1 of 20 elsewhere, p=10^-4.3",
		"Held since", "(2h)", "expires", "(in 21h",
		fmt.Sprintf("fleetrepair approve %d --reason 'WHY' --context prod", id),
		fmt.Sprintf("fleetrepair reject %d --reason 'WHY' --context prod", id),
		"fleetrepair breakers resume zone=z1 --reason 'WHY' --context prod",
		"-> awaiting_approval", "controller", "breaker zone=z1 open", "Xid 79", "GPU has fallen off the bus")

	// approve and reject: the operator of the context's token is in the audit.
	out = mustCLI(t, "approve", fmt.Sprint(id), "--reason", "GPU fell off the bus; the zone is fine")
	wantAll(t, "approve", out, fmt.Sprintf("repair %d c1/z1-2: approved", id), "re-validates", fmt.Sprintf("fleetrepair repairs show %d", id))
	out = mustCLI(t, "repairs", "show", fmt.Sprint(id))
	wantAll(t, "repairs show (approved)", out, "awaiting_approval -> approved", "user:otto", "GPU fell off the bus; the zone is fine")
	if strings.Contains(out, "To approve") {
		t.Errorf("an approved repair still says how to approve it:\n%s", out)
	}
	out = mustCLI(t, "reject", fmt.Sprint(f.held["z2-0"]), "--reason", "reset by hand instead")
	wantAll(t, "reject", out, "c1/z2-0: rejected", "will not be deleted")
	var d api.RepairDetail
	if err := json.Unmarshal([]byte(mustCLI(t, "repairs", "show", fmt.Sprint(f.held["z2-0"]), "-o", "json")), &d); err != nil ||
		d.Repair.State != "rejected" || d.Audit[len(d.Audit)-1].Actor != "user:otto" {
		t.Errorf("repairs show -o json after reject: %v %+v", err, d)
	}

	// Refusals say why: a repair no longer held, a viewer, no token, no server.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"approve", fmt.Sprint(id), "--reason", "again"}, "409 Conflict: cannot approve this repair: the repair is approved, not awaiting_approval"},
		{[]string{"approve", fmt.Sprint(f.held["z1-3"]), "--reason", "x", "--token", "viewer-token"}, "403 Forbidden: operator not allowed"},
		{[]string{"approve", fmt.Sprint(f.held["z1-3"]), "--reason", "x", "--context", "nowhere"}, "from context nowhere"},
		{[]string{"approve", fmt.Sprint(f.held["z1-3"])}, "--reason is required"},
		{[]string{"approve", "z1-3", "--reason", "x"}, `repair id "z1-3": want a positive number`},
		{[]string{"repairs", "show", "99999"}, "404 Not Found: not found: no repair 99999"},
		{[]string{"approve", "99999", "--reason", "x"}, "not found: no repair 99999"},
		{[]string{"repairs", "list", "--server", "notaurl"}, `server "notaurl" (from --server) is not an http:// or https:// URL`},
		{[]string{"repairs", "list", "-o", "xml"}, `--output "xml": want table, wide, json, yaml`},
		{[]string{"repairs", "list", "--context", "staging"}, `context "staging" is not in the client config`},
		{[]string{"breakers", "resume", "zone=z1", "--reason", "x"}, "403 Forbidden"}, // otto is no admin
	} {
		if _, _, err := cli(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.args, err, tc.want)
		}
	}

	// The admin resumes the breaker; the list says none is open, the decision names her.
	out = mustCLI(t, "breakers", "resume", "zone=z1", "--reason", "AZ recovered", "--token", "admin-token")
	wantAll(t, "breakers resume", out, "breaker zone=z1 resumed; 0 breaker(s) still open", "fleetrepair repairs list --state awaiting_approval")
	out = mustCLI(t, "breakers", "list")
	wantAll(t, "breakers list after resume", out, "No open breakers", "breaker zone=z1 resumed by user:ada: AZ recovered", "6 repair(s) await approval not held by an open breaker")
}

// TestCLIKubeContext: a kubeconfig context reaches the controller through
// its API server's service proxy, with the context's credentials, no
// port-forward: the operator token travels in X-Fleetrepair-Token, since
// the API server drops Authorization. The API server here is a stand-in
// that authenticates (TLS: client-go sends credentials only over https) and
// proxies as kube-apiserver does (kube-apiserver
// refuses to proxy to loopback addresses, where a test's controller is).
func TestCLIKubeContext(t *testing.T) {
	home := isolate(t)
	f := newFleet(t)
	const prefix = "/api/v1/namespaces/fleetrepair/services/http:fleetrepair-controller:http/proxy"
	var proxied int
	apiserver := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer kube-user-token" {
			http.Error(w, `{"kind":"Status","message":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		rest, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok {
			http.Error(w, `{"kind":"Status","message":"not found"}`, http.StatusNotFound)
			return
		}
		proxied++
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.RequestURI = rest, ""
		r2.Header.Del("Authorization") // kube-apiserver's authentication filter removes it
		f.handler.ServeHTTP(w, r2)
	}))
	t.Cleanup(apiserver.Close)
	writeFile(t, filepath.Join(home, ".kube", "config"), fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: dev
clusters:
  - name: prod-cluster
    cluster: {server: %s, certificate-authority-data: %s}
users:
  - name: sre
    user: {token: kube-user-token}
contexts:
  - name: prod-admin
    context: {cluster: prod-cluster, user: sre}
  - name: dev
    context: {cluster: prod-cluster, user: nobody}
`, apiserver.URL, base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: apiserver.Certificate().Raw}))))

	out := mustCLI(t, "repairs", "list", "--kube-context", "prod-admin", "--state", "awaiting_approval", "--token", "viewer-token")
	wantAll(t, "repairs list through the API server", out, "c1/z1-0", "breaker zone=z1")
	if proxied == 0 {
		t.Fatal("nothing went through the API server's proxy")
	}
	// A context of the config file names the kubeconfig context and the token.
	writeFile(t, filepath.Join(home, ".config", "fleetrepair", "config.yaml"), `current-context: prod
contexts:
  - name: prod
    kube-context: prod-admin
    token: admin-token
`)
	out = mustCLI(t, "breakers", "resume", "zone=z1", "--reason", "AZ recovered")
	wantAll(t, "resume through the API server", out, "breaker zone=z1 resumed")
	out = mustCLI(t, "breakers", "list")
	wantAll(t, "breakers list through the API server", out, "resumed by user:ada: AZ recovered")
	// The kubeconfig's current context has no credentials the API server accepts.
	if _, _, err := cli("repairs", "list", "--kube-context", "dev", "--context", "prod"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("kube context without credentials: %v, want the API server's 401", err)
	}
	if _, _, err := cli("repairs", "list", "--kube-context", "missing"); err == nil || !strings.Contains(err.Error(), `kubeconfig context "missing"`) {
		t.Errorf("unknown kube context: %v", err)
	}
}

// TestConnectionPrecedence: --server beats FLEETREPAIR_SERVER beats the
// context (--context, FLEETREPAIR_CONTEXT, current-context); --token beats
// FLEETREPAIR_TOKEN beats the context's token or token-file.
func TestConnectionPrecedence(t *testing.T) {
	home := isolate(t)
	writeFile(t, filepath.Join(home, "b.token"), " token-b \n")
	cfg := filepath.Join(home, "fr.yaml")
	writeFile(t, cfg, `current-context: a
contexts:
  - {name: a, server: "https://a.example", token: token-a}
  - {name: b, server: "https://b.example", token-file: ~/b.token}
`)
	for _, tc := range []struct {
		env           map[string]string
		conn          connection
		server, token string
	}{
		{conn: connection{}, server: defaultServer},
		{conn: connection{config: cfg}, server: "https://a.example", token: "token-a"},
		{env: map[string]string{"FLEETREPAIR_CLIENT_CONFIG": cfg, "FLEETREPAIR_CONTEXT": "b"}, server: "https://b.example", token: "token-b"},
		{conn: connection{config: cfg, context: "b"}, env: map[string]string{"FLEETREPAIR_TOKEN": "env-token"}, server: "https://b.example", token: "env-token"},
		{conn: connection{config: cfg, token: "flag-token"}, env: map[string]string{"FLEETREPAIR_SERVER": "http://env.example"}, server: "http://env.example", token: "flag-token"},
		{conn: connection{config: cfg, server: "http://flag.example"}, env: map[string]string{"FLEETREPAIR_SERVER": "http://env.example"}, server: "http://flag.example", token: "token-a"},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		got, err := tc.conn.resolve()
		if err != nil || got.server != tc.server || got.token != tc.token {
			t.Errorf("%+v env %v: %q %q (%v), want %q %q", tc.conn, tc.env, got.server, got.token, err, tc.server, tc.token)
		}
		for k := range tc.env {
			t.Setenv(k, "")
		}
	}
	writeFile(t, cfg, "contexts:\n  - {name: a, servr: x}\n")
	if _, err := (&connection{config: cfg}).resolve(); err == nil || !strings.Contains(err.Error(), "servr") {
		t.Errorf("a misspelt field: %v, want an error naming it", err)
	}
	if _, err := (&connection{config: filepath.Join(home, "missing.yaml")}).resolve(); err == nil {
		t.Error("a named config file that does not exist: no error")
	}
}

// TestEveryCommandSaysWhatItDoes: every command has a one-line summary, every
// client command a description in its --help, and reject's describes
// rejecting.
func TestEveryCommandSaysWhatItDoes(t *testing.T) {
	var walk func(c *cobra.Command)
	root := &cobra.Command{Use: "fleetrepair"}
	root.AddCommand(newControllerCmd(), newMigrateCmd(), newDiagnoseCmd(), newRepairsCmd(), newDecisionCmd("approve"), newDecisionCmd("reject"),
		newBreakersCmd(), newNodesCmd(), newSimulateCmd(), newShadowCmd())
	client := map[string]bool{"repairs": true, "approve": true, "reject": true, "breakers": true, "nodes": true, "shadow": true}
	walk = func(c *cobra.Command) {
		top := c
		for top.HasParent() && top.Parent() != root {
			top = top.Parent()
		}
		if strings.TrimSpace(c.Short) == "" {
			t.Errorf("%q has no summary", c.CommandPath())
		}
		if client[top.Name()] && strings.TrimSpace(c.Long) == "" {
			t.Errorf("%q --help does not describe it", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	for _, c := range root.Commands() {
		walk(c)
	}
	help := func(args ...string) string {
		out, _, err := cli(append(args, "--help")...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	wantAll(t, "reject --help", help("reject"), "Reject a repair that waits for on-call", "closes as rejected", "NodeClaim is never deleted", "--reason")
	wantAll(t, "approve --help", help("approve"), "Approve a repair", "re-validates", "overrides the breaker for this")
	wantAll(t, "breakers resume --help", help("breakers", "resume"), "Close an open breaker", "audit names your resume")
	wantAll(t, "repairs show --help", help("repairs", "show"), "exact", "commands that approve or reject it")
	wantAll(t, "repairs list --help", help("repairs", "list"), "HELD-BY", "--all", "--cursor", "--context", "--kube-context", "-o, --output")
}

// TestCLILimitOutOfRange: a --limit the API would refuse is refused before
// any call (the client leaves a limit <= 0 out of the request, so --limit 0
// would otherwise list a default page without a word).
func TestCLILimitOutOfRange(t *testing.T) {
	isolate(t)
	for _, args := range [][]string{
		{"repairs", "list", "--limit", "0"},
		{"repairs", "list", "--limit", "-1"},
		{"repairs", "list", "--limit", "501"},
		{"nodes", "list", "--limit", "0"},
		{"nodes", "list", "--limit", "100000"},
	} {
		_, _, err := cli(append(args, "--server", "http://127.0.0.1:1")...)
		if err == nil || !strings.Contains(err.Error(), "want 1..500") || strings.Contains(err.Error(), "connection refused") {
			t.Errorf("%v: err %v, want the limit refused before any call", args, err)
		}
	}
}

// TestMigrateRefusesAnUnknownDirection: "migrate sideways" names the
// argument before it asks for a database.
func TestMigrateRefusesAnUnknownDirection(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	_, _, err := cli("migrate", "sideways")
	if err == nil || !strings.Contains(err.Error(), `invalid argument "sideways"`) {
		t.Fatalf("migrate sideways: %v, want the argument refused", err)
	}
}
