package kubeapi

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/test/envtest"
)

// dashboard is the part of Grafana's dashboard JSON model the test reads.
type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasourceRef  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *datasourceRef           `json:"datasource"`
	GridPos    struct{ X, Y, W, H int } `json:"gridPos"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// panelTypes are the Grafana core panels the dashboard may use.
var panelTypes = []string{"row", "stat", "timeseries", "table", "gauge", "bargauge", "text"}

// grafanaVars are the variables Grafana substitutes before a query reaches
// Prometheus, with values of the right kind for parsing.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${cluster}", ".*", "$cluster", ".*")

// TestGrafanaDashboard renders the chart's dashboard ConfigMap and checks
// the JSON it carries: the sidecar's label; Grafana's structure (uid,
// title, schema version, unique panel ids, grid positions inside 24
// columns, known panel types, every query on the ${datasource} variable,
// unique refIds); every PromQL expression, after Grafana's variable
// substitution, parses (promtool check rules, Prometheus's own parser, on
// a rules file of one recording rule per expression); and every metric an
// expression or a variable query reads is one the controller really
// registers (exportedMetrics, as the alert test).
func TestGrafanaDashboard(t *testing.T) {
	promtool := envtest.Tool(t, "promtool")
	objs, err := render(t, baseValues+"grafanaDashboard: {enabled: true}\n")
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var raw string
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" {
			continue
		}
		if s, ok, _ := unstructuredString(o.Object, "data", "fleetrepair.json"); ok {
			raw = s
			if o.GetLabels()["grafana_dashboard"] != "1" {
				t.Errorf("dashboard ConfigMap labels %v, want grafana_dashboard: \"1\" for Grafana's sidecar", o.GetLabels())
			}
		}
	}
	if raw == "" {
		t.Fatal("no ConfigMap with fleetrepair.json rendered")
	}
	if off, err := render(t, baseValues); err != nil {
		t.Fatal(err)
	} else {
		for _, o := range off {
			if _, ok, _ := unstructuredString(o.Object, "data", "fleetrepair.json"); ok {
				t.Error("dashboard ConfigMap rendered with grafanaDashboard.enabled false (the default)")
			}
		}
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(raw))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("dashboard uid %q title %q schemaVersion %d: want a uid, a title and schema 36 or later", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["cluster"] != "query" {
		t.Errorf("template variables %v, want datasource (datasource) and cluster (query)", vars)
	}

	exported := exportedMetrics(t)
	var exprs []string
	readMetrics := func(where, expr string) {
		t.Helper()
		names := metricNames(grafanaVars.Replace(expr))
		if len(names) == 0 {
			t.Errorf("%s: %q reads no metric", where, expr)
		}
		for _, m := range names {
			if !exported[m] {
				t.Errorf("%s reads %s, which the controller does not register", where, m)
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query: %v", v.Name, err)
			continue
		}
		m := regexp.MustCompile(`^label_values\((\w+), *(\w+)\)$`).FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q, want label_values(metric, label)", v.Name, q.Query)
			continue
		}
		readMetrics("variable "+v.Name, m[1])
		if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			t.Errorf("variable %s queries %+v, want the ${datasource} variable", v.Name, v.Datasource)
		}
	}
	ids := map[int]string{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if other, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("%s: id taken by %q (or 0)", where, other)
			}
			ids[p.ID] = p.Title
			if !slices.Contains(panelTypes, p.Type) {
				t.Errorf("%s: type %q is not one of %v", where, p.Type, panelTypes)
			}
			if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v outside the 24-column grid", where, g)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Title == "" || len(p.Targets) == 0 {
				t.Errorf("%s: needs a title and at least one query", where)
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: datasource %+v, want the ${datasource} variable", where, p.Datasource)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("%s: refId %q empty or repeated", where, tg.RefID)
				}
				refs[tg.RefID] = true
				if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
					t.Errorf("%s %s: datasource %+v, want the ${datasource} variable", where, tg.RefID, tg.Datasource)
				}
				readMetrics(where+" "+tg.RefID, tg.Expr)
				exprs = append(exprs, grafanaVars.Replace(tg.Expr))
			}
		}
	}
	walk(d.Panels)

	// Prometheus's parser, through promtool: one recording rule per query.
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for i, e := range exprs {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: e})
	}
	doc, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yaml"), doc, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "dashboard.yaml")).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard's %d queries: %v\n%s", len(exprs), err, out)
	}
	t.Logf("%d panels, %d queries parsed: %s", len(ids), len(exprs), strings.TrimSpace(string(out)))
}

// unstructuredString returns obj[path...] when it is a string.
func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[p]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// promqlWords are PromQL's keywords, aggregations and functions that can
// stand where a metric name could: everything else an expression names
// outside braces, brackets, strings and grouping lists is a metric.
var promqlWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "offset": true, "and": true, "or": true, "unless": true, "atan2": true,
	"inf": true, "nan": true,
}

var (
	promqlStrings = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlBraces  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGroups  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent   = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
)

// metricNames returns the metric names an expression selects: the
// identifiers left once strings, label matchers, range selectors and
// grouping label lists are removed, that are neither a keyword nor a
// function (followed by "("). It is a reader for checking names, not a
// parser: promtool parses.
func metricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlBraces.ReplaceAllString(s, " ")
	s = promqlGroups.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range promqlIdent.FindAllStringIndex(s, -1) {
		w := s[loc[0]:loc[1]]
		if loc[0] > 0 && (s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9' || s[loc[0]-1] == '.') {
			continue // the unit of a number ("5m") or an exponent
		}
		rest := strings.TrimLeft(s[loc[1]:], " \t\n")
		if promqlWords[strings.ToLower(w)] || strings.HasPrefix(rest, "(") {
			continue
		}
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// TestMetricNames: the reader finds every selected metric, a misspelt one
// included, and nothing else.
func TestMetricNames(t *testing.T) {
	for expr, want := range map[string]string{
		`max(fleetrepair_kill_switch)`:                                                                             "fleetrepair_kill_switch",
		`count(max by (cohort) (fleetrepair_breaker_open) == 1) or vector(0)`:                                      "fleetrepair_breaker_open",
		`sum by (le) (rate(workqueue_work_duration_seconds_bucket{name="nodes", x=~"a|b"}[5m]))`:                   "workqueue_work_duration_seconds_bucket",
		`histogram_quantile(0.9, sum by (le) (rate(fleetrepair_time_to_replace_seconds_bucket[5m]))) > 1e3`:        "fleetrepair_time_to_replace_seconds_bucket",
		`sum by (cluster) (fleetrepair_cluster_leader) == 0 and on (cluster) fleetrpair_repairs{state="x by (y)"}`: "fleetrepair_cluster_leader fleetrpair_repairs",
		`increase(fleetrepair_nodeclaim_deletions_total[1h] offset 5m) / ignoring (pod) up`:                        "fleetrepair_nodeclaim_deletions_total up",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}
