package kubeapi

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/agent/uplink"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestAlertRules checks the PrometheusRule the chart renders: promtool
// check rules (syntax, PromQL, templates), promtool test rules with
// testdata/alerts_test.yaml (each alert fires on the series the controller
// exports and not before its `for`), every alert has a runbook in
// docs/runbooks/ that names it, and every metric an alert reads is one the
// controller or the agent really registers.
func TestAlertRules(t *testing.T) {
	promtool := envtest.Tool(t, "promtool")
	objs, err := render(t, baseValues+"prometheusRule: {enabled: true}\n", promOpAPI...)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	rule := find(objs, "PrometheusRule", "fleetrepair")
	if rule == nil {
		t.Fatal("no PrometheusRule rendered")
	}
	spec, err := yaml.Marshal(rule.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), unit, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
	run("check", "rules", "rules.yaml")
	run("test", "rules", "alerts_test.yaml")

	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(spec, &doc); err != nil {
		t.Fatal(err)
	}
	root, err := envtest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	metric := regexp.MustCompile(`\bfleetrepair_[a-z_]+\b`)
	var alerts []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			url := r.Annotations["runbook_url"]
			name := filepath.Base(url)
			if !strings.HasPrefix(url, "https://github.com/fleetrepair/fleetrepair/blob/main/docs/runbooks/") || !strings.HasSuffix(name, ".md") {
				t.Errorf("%s: runbook_url %q, want docs/runbooks/<name>.md", r.Alert, url)
				continue
			}
			b, err := os.ReadFile(filepath.Join(root, "docs", "runbooks", name))
			if err != nil {
				t.Errorf("%s: runbook: %v", r.Alert, err)
			} else if !strings.Contains(string(b), r.Alert) {
				t.Errorf("%s: runbook docs/runbooks/%s does not name the alert", r.Alert, name)
			}
			for _, m := range metric.FindAllString(r.Expr, -1) {
				if !exported[m] {
					t.Errorf("%s reads %s, which neither the controller nor the agent registers", r.Alert, m)
				}
			}
		}
	}
	// Every alert is exercised by the unit tests.
	for _, a := range alerts {
		if !strings.Contains(string(unit), "alertname: "+a+"\n") {
			t.Errorf("alert %s has no case in testdata/alerts_test.yaml", a)
		}
	}
	t.Logf("%d alerts: %s", len(alerts), strings.Join(alerts, ", "))
}

// descRecorder is a Registerer that records the names of the metrics each
// collector describes.
type descRecorder map[string]bool

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d[m[1]] = true
		}
	}
	return nil
}
func (d descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}
func (d descRecorder) Unregister(prometheus.Collector) bool { return true }

// exportedMetrics returns the metric names the controller (API and
// reconciler, built as cmd/runner builds them) and the agent's
// uplink register, with the _bucket/_sum/_count series of histograms.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	st := pgtest.Store(t)
	rec := descRecorder{}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Registerer: rec, Log: log}); err != nil {
		t.Fatal(err)
	}
	eng, err := diagnose.New(diagnose.Options{Catalog: catalog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repair.New(repair.Config{Store: st, Engine: eng, Registerer: rec, Log: log}); err != nil {
		t.Fatal(err)
	}
	if _, err := uplink.New(uplink.Config{URL: "http://controller", Cluster: "c1", Node: "n1", BootID: "b", Token: "x", Registerer: rec, Logger: log}); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	var names []string
	for n := range rec {
		out[n] = true
		names = append(names, n)
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			out[n+s] = true
		}
	}
	sort.Strings(names)
	if !slices.Contains(names, "fleetrepair_repairs") || !slices.Contains(names, "fleetrepair_reconcile_total") {
		t.Fatalf("registered metrics %v: want the API's and the reconciler's", names)
	}
	return out
}
