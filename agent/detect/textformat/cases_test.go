package textformat_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fleetrepair/fleetrepair/test/casecheck"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/agent/detect/textformat"
)

// casesDir holds the case corpus copied from shared/cases.
const casesDir = "../../../test/fixtures/cases"

// side says who reads an input file of the corpus.
type side int

const (
	agentSide      side = iota // a node-side input: it goes through textformat.Scan
	controllerSide             // a Kubernetes object or Karpenter event: the controller's watchers read it
	scenarioSide               // a fleet scenario: the controller's fleet simulation replays it
	contextSide                // context for a human or a cohort, no finding of its own
)

// input is one input file of one case: who reads it and which of the case's
// expected findings (indexes into expected.yaml findings) it must produce,
// exactly, alone.
type input struct {
	side side
	want []int
	why  string // for the other sides: where it is tested
}

// corpus classifies every input file of every case. A file that is missing
// here, or an expected finding that no entry owns, fails TestCorpusComplete,
// so a new case cannot slip past the agent tests unclassified.
var corpus = map[string]map[string]input{
	"c01": {"input.kmsg.txt": {want: all(3)}, "input.devkmsg.txt": {want: all(3)}},
	"c02": {"input.kmsg.txt": {want: all(3)}, "input.devkmsg.txt": {want: all(3)}},
	"c03": {"input.kmsg.txt": {want: all(2)}},
	"c04": {"input.kmsg.txt": {want: []int{0, 1, 2, 3}}, "input.nvidia-smi.txt": {want: []int{4}}},
	"c05": {"input.kmsg.txt": {want: all(3)}, "input.devkmsg.txt": {want: all(3)}},
	"c06": {"input.nvidia-smi.txt": {want: []int{0}}},
	"c07": {"scenario.yaml": {side: scenarioSide, want: all(5), why: "findings injected by the scenario"}},
	"c08": {"input.health-monitor.log": {want: []int{0}}},
	"c09": {"input.kmsg.txt": {want: all(5)}},
	"c10": {"input.kmsg.txt": {want: all(2)}, "scenario.yaml": {side: scenarioSide}},
	"c11": {
		"input.nvidia-smi.txt":           {want: []int{0}},
		"input.nvidia-container-cli.log": {}, // informational start-up lines: nothing
		"input.docker-version.txt":       {}, // versions only: nothing
		// expected finding 1 (runtime-wedge, kill does not complete) comes
		// from context.simulate: agent/source/procfs TestCaseC11StuckKill.
	},
	"c12": {"input.nvidia-smi.txt": {want: []int{0}}, "input.kubelet-event.txt": {want: []int{1}}},
	"c13": {"input.nvidia-smi.txt": {want: []int{0}}},
	"c14": {
		"input.device-plugin.log": {},               // the skipped NVML event is informational: nothing
		"input.node-describe.txt": {want: []int{0}}, // Capacity/Allocatable: agent/detect/describe
	},
	"c15": {"input.dcgmi-diag.txt": {want: all(2)}, "input.dcgmi-diag.collapsed.txt": {want: all(2)}},
	"c16": {
		"input.metrics-last-value.prom": {want: []int{0}},
		"input.metrics-windowed.prom":   {want: []int{1}},
		"scenario.yaml":                 {side: scenarioSide},
	},
	"c17": {
		"input.node-condition.txt": {side: controllerSide, want: []int{0}, why: "a vendor agent's NodeCondition"},
		"scenario.yaml":            {side: scenarioSide},
	},
	"c18": {"input.kmsg.txt": {want: all(1)}},
	"c19": {"input.kubelet.log": {want: []int{0}}},
	"c20": {
		"input.agent.log":           {want: []int{0}},
		"input.node-condition.yaml": {side: controllerSide, want: []int{1}, why: "a vendor agent's NodeCondition"},
		"scenario.yaml":             {side: scenarioSide},
	},
	"c21": {
		"input.e2e-log.txt": {side: controllerSide, want: all(4), why: "Node conditions"},
		"input.node.yaml":   {side: controllerSide, want: all(4), why: "Node conditions"},
	},
	"c22": {
		"input.events.txt": {side: controllerSide, want: all(1), why: "Karpenter events"},
		"scenario.yaml":    {side: scenarioSide},
	},
	"c23": {"input.nodeclaim-describe.txt": {side: controllerSide, want: all(1), why: "NodeClaim status"}},
	"c24": {
		"input.nvidia-smi.txt":     {want: []int{0}},
		"input.nvidia-smi-k8s.txt": {want: []int{1}},
		"input.containerd.log":     {want: []int{2}},
		"input.apt-history.log":    {side: contextSide, why: "package history: context for the cohort (which package changed), no finding of its own"},
	},
	"c25": {"input.kmsg.txt": {want: all(6)}},
	"c26": {"input.kmsg.txt": {want: all(1)}},
	"c27": {
		"input.nodeclaim.yaml": {side: controllerSide, want: []int{0}, why: "NodeClaim deletionTimestamp and finalizers: controller/kube reads the NodeClaim"},
		"input.node.yaml":      {side: controllerSide, want: []int{1}, why: "Node deletionTimestamp: controller/kube reads the Node"},
	},
	"c28": {
		"input.node1-describe.txt": {want: []int{0}},
		"input.node2-describe.txt": {want: []int{1, 2, 3}},
		"scenario.yaml":            {side: scenarioSide},
	},
	"c29": {"input.job.log": {want: []int{0}}, "input.pod.log": {want: []int{1}}},
}

// simulated lists expected findings produced by a fake component that a
// case's context.simulate describes, and the test that checks them.
var simulated = map[string][]int{"c11": {1}}

func all(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// caseFile is the part of expected.yaml the agent side checks.
type caseFile struct {
	ID     string `json:"id"`
	Inputs []struct {
		File   string `json:"file"`
		Format string `json:"format"`
	} `json:"inputs"`
	Findings []map[string]any `json:"findings"`
}

type loaded struct {
	dir   string
	c     caseFile
	files []string // every input.* and scenario.yaml in the folder
}

func loadCorpus(t *testing.T) map[string]loaded {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(casesDir, "c*"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no cases under %s: %v", casesDir, err)
	}
	out := map[string]loaded{}
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, "expected.yaml"))
		if err != nil {
			t.Fatalf("read case: %v", err)
		}
		var c caseFile
		if err := yaml.Unmarshal(data, &c); err != nil {
			t.Fatalf("parse %s/expected.yaml: %v", dir, err)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "input.*"))
		if _, err := os.Stat(filepath.Join(dir, "scenario.yaml")); err == nil {
			files = append(files, filepath.Join(dir, "scenario.yaml"))
		}
		for i := range files {
			files[i] = filepath.Base(files[i])
		}
		out[c.ID] = loaded{dir: dir, c: c, files: files}
	}
	return out
}

// TestCorpusComplete checks that every input file of every case is
// classified and every expected finding is owned by an input (or a
// simulation), so that no case escapes the agent's tests.
func TestCorpusComplete(t *testing.T) {
	t.Parallel()
	for id, l := range loadCorpus(t) {
		entries, ok := corpus[id]
		if !ok {
			t.Errorf("case %s is not classified in corpus", id)
			continue
		}
		owned := make([]bool, len(l.c.Findings))
		for _, f := range l.files {
			in, ok := entries[f]
			if !ok {
				t.Errorf("%s/%s is not classified in corpus", id, f)
				continue
			}
			for _, i := range in.want {
				if i >= len(owned) {
					t.Errorf("%s/%s: finding %d does not exist", id, f, i)
					continue
				}
				owned[i] = true
			}
		}
		for f := range entries {
			if !slices.Contains(l.files, f) {
				t.Errorf("corpus names %s/%s, which does not exist", id, f)
			}
		}
		for _, i := range simulated[id] {
			owned[i] = true
		}
		for i, o := range owned {
			if !o {
				t.Errorf("%s: expected finding %d (%v) is produced by no input", id, i, l.c.Findings[i])
			}
		}
	}
}

// TestCases runs every agent-side input file of the corpus, each on its own,
// through textformat.Scan, in the format expected.yaml names and with format
// detection, and compares the findings with the expected ones under the
// corpus rules: detector, gpu_pci, xid and count always, plus every other key
// the expected finding gives; a finding not expected is a failure.
func TestCases(t *testing.T) {
	t.Parallel()
	for id, l := range loadCorpus(t) {
		formats := map[string]string{}
		for _, in := range l.c.Inputs {
			formats[in.File] = in.Format
		}
		for file, in := range corpus[id] {
			if in.side != agentSide {
				continue
			}
			declared, err := textformat.ParseFormat(formats[file])
			if err != nil {
				t.Errorf("%s/%s: declared format: %v", id, file, err)
				continue
			}
			var want []map[string]any
			for _, i := range in.want {
				want = append(want, l.c.Findings[i])
			}
			for _, format := range []textformat.Format{declared, textformat.Auto} {
				t.Run(id+"/"+file+"/"+string(format), func(t *testing.T) {
					t.Parallel()
					f, err := os.Open(filepath.Join(l.dir, file))
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					res, err := textformat.Scan(context.Background(), f, format, textformat.Options{Node: "node-a1", BootID: "boot-1"})
					if err != nil {
						t.Fatalf("Scan: %v", err)
					}
					if format == textformat.Auto && sameFamily(res.Format) != sameFamily(declared) {
						t.Errorf("detected format %q, declared %q", res.Format, declared)
					}
					if res.Kernel != nil && res.Kernel.Text.Unparsed != 0 {
						t.Errorf("%d unparsed kernel lines", res.Kernel.Text.Unparsed)
					}
					for _, g := range res.Findings {
						if g.ID == "" || g.Node != "node-a1" || g.BootID != "boot-1" || len(g.Evidence) == 0 || g.Count < 1 {
							t.Errorf("incomplete finding %+v", g)
						}
					}
					casecheck.CompareFindings(t, want, res.Findings)
				})
			}
		}
	}
}

// sameFamily folds the kernel renderings into one name: format detection
// only has to tell a kernel log from the other inputs.
func sameFamily(f textformat.Format) string {
	if _, ok := f.Kernel(); ok {
		return "kernel"
	}
	return string(f)
}
