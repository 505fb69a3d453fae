package load

import (
	"flag"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// makeDefaults are `make load`'s LOAD_ARGS with the Makefile's defaults.
var makeDefaults = []string{"-load.nodes=1000", "-load.clusters=1", "-load.first-cluster-nodes=0", "-load.profile=",
	"-load.replicas=2", "-load.workers=16", "-load.zones=4", "-load.heartbeat=30s", "-load.steady=60s",
	"-load.pg-outage=60s", "-load.toleration=30s", "-load.db-pool=32", "-load.heap-every=5m", "-load.agent-ramp=0",
	"-load.lease-duration=0", "-load.kill-at=1.5s"}

// withArgs is makeDefaults with each of set ("-load.nodes=abc") in place
// of the default of its flag.
func withArgs(set ...string) []string {
	out := append([]string(nil), makeDefaults...)
	for _, s := range set {
		name, _, _ := strings.Cut(s, "=")
		for i, a := range out {
			if strings.HasPrefix(a, name+"=") {
				out[i] = s
			}
		}
	}
	return out
}

func TestCheckFlags(t *testing.T) {
	if bad := CheckFlags(makeDefaults); bad != nil {
		t.Fatalf("the Makefile's defaults: %q", bad)
	}
	if bad := CheckFlags(nil); bad != nil {
		t.Fatalf("no flags: %q", bad)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string // whole lines
	}{
		{"not a number", withArgs("-load.nodes=abc"),
			[]string{"LOAD_NODES=abc: want a whole number (-load.nodes: simulated nodes, over every cluster (1 to 1,000,000))"}},
		{"a duration without unit", withArgs("-load.heartbeat=30"),
			[]string{"LOAD_HEARTBEAT=30: want a duration such as 90s, 5m or 1h30m (-load.heartbeat: agent heartbeat interval (more than 0))"}},
		{"out of range", withArgs("-load.replicas=3"), []string{"LOAD_REPLICAS=3: replicas 3: want 1 or 2"}},
		{"a zero refused", withArgs("-load.nodes=0"), []string{"LOAD_NODES=0: nodes 0: want 1 or more"}},
		{"two bad values", withArgs("-load.replicas=3", "-load.zones=1"),
			[]string{"LOAD_ZONES=1: zones 1: want 2 to 26", "LOAD_REPLICAS=3: replicas 3: want 1 or 2"}},
		{"the variable of another name", withArgs("-load.lease-duration=2500ms"),
			[]string{"LOAD_LEASE=2500ms: lease-duration 2.5s: want a whole number of seconds, at least 1s (the Lease stores whole seconds), or 0 for the controller's default"}},
		{"unparsable and out of range at once", withArgs("-load.nodes=abc", "-load.replicas=3", "-load.heartbeat=fast"),
			[]string{"LOAD_NODES=abc: want a whole number (-load.nodes: simulated nodes, over every cluster (1 to 1,000,000))",
				"LOAD_HEARTBEAT=fast: want a duration such as 90s, 5m or 1h30m (-load.heartbeat: agent heartbeat interval (more than 0))",
				"LOAD_REPLICAS=3: replicas 3: want 1 or 2"}},
		{"a kill after the wave", withArgs("-load.kill-at=4s"), []string{"LOAD_KILL_AT=4s: kill-at 4s: want 0 (with the first failing report) to 3s (the wave's spread)"}},
		{"an unknown flag", []string{"-load.nodez=5"},
			[]string{`"-load.nodez=5": want -load.NAME=VALUE, NAME one of BenchmarkLoad's flags (go test ./test/load -args -help)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckFlags(tc.args)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("lines\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestMakeVarsMatchTheMakefile holds makeVars to the Makefile's LOAD_ARGS,
// and makeDefaults to the flags' own defaults: every -load.NAME=$(VAR)
// there is NAME: VAR here, and every entry here a flag of BenchmarkLoad.
func TestMakeVarsMatchTheMakefile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	def := regexp.MustCompile(`(?ms)^LOAD_ARGS = (.*?)\nload:`).FindSubmatch(b)
	if def == nil {
		t.Fatal("no LOAD_ARGS = ... before the load target in the Makefile")
	}
	inMake := map[string]string{}
	for _, m := range regexp.MustCompile(`-(load\.[a-z-]+)=\$\((LOAD_[A-Z_]+)\)`).FindAllSubmatch(def[1], -1) {
		inMake[string(m[1])] = string(m[2])
	}
	if !maps.Equal(inMake, makeVars) {
		t.Fatalf("the Makefile's LOAD_ARGS set %v, makeVars names %v", inMake, makeVars)
	}
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	newLoadFlags(fs)
	for name := range makeVars {
		if fs.Lookup(name) == nil {
			t.Errorf("makeVars names %s, which is no flag of BenchmarkLoad", name)
		}
	}
	for _, a := range makeDefaults {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		v := regexp.MustCompile(`(?m)^` + makeVars[name] + ` +\?= *(.*)$`).FindSubmatch(b)
		if v == nil {
			t.Errorf("the Makefile has no %s ?= ... for %s", makeVars[name], a)
		} else if string(v[1]) != value {
			t.Errorf("makeDefaults has %s, the Makefile's %s ?= %s", a, makeVars[name], v[1])
		}
	}
}
