package detect_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetrepair/fleetrepair/test/casecheck"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// casesDir holds the case corpus copied from shared/cases.
const casesDir = "../../test/fixtures/cases"

// kernelFormats maps the inputs[].format values of expected.yaml that are
// kernel log renderings to the kmsg parser's formats.
var kernelFormats = map[string]kmsg.Format{
	"devkmsg":        kmsg.FormatDevKmsg,
	"dmesg":          kmsg.FormatDmesg,
	"dmesg-ctime":    kmsg.FormatDmesgCtime,
	"dmesg-relative": kmsg.FormatDmesgRelative,
	"syslog":         kmsg.FormatSyslog,
	"journalctl-k":   kmsg.FormatJournalctlK,
}

// caseFile is the part of expected.yaml the agent side checks.
type caseFile struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	Inputs []struct {
		File   string `json:"file"`
		Format string `json:"format"`
	} `json:"inputs"`
	Findings []map[string]any `json:"findings"`
}

// kernelCase is one kernel-log input of one case.
type kernelCase struct {
	dir, file string
	format    kmsg.Format
	expected  []map[string]any
}

// loadKernelCases walks the corpus and returns every kernel-log input file
// with the expected findings that kernel detectors produce (a case may also
// expect findings from other inputs, e.g. c04's nvidia-smi nvlink-inactive).
func loadKernelCases(t testing.TB) []kernelCase {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(casesDir, "c*"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no cases under %s: %v", casesDir, err)
	}
	kernelDetectors := map[string]bool{
		finding.DetectorXid: true, finding.DetectorAERFatal: true,
		finding.DetectorAERNonFatal: true, finding.DetectorAERCorrectable: true,
		finding.DetectorNVSwitchSXid: true, finding.DetectorHungTask: true,
		finding.DetectorSoftLockup: true, finding.DetectorRCUStall: true,
	}
	for _, r := range detect.DefaultRules().Rules {
		kernelDetectors[r.Detector] = true
	}
	var out []kernelCase
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, "expected.yaml"))
		if err != nil {
			t.Fatalf("read case: %v", err)
		}
		var c caseFile
		if err := yaml.Unmarshal(data, &c); err != nil {
			t.Fatalf("parse %s/expected.yaml: %v", dir, err)
		}
		var want []map[string]any
		for _, f := range c.Findings {
			if kernelDetectors[fmt.Sprint(f["detector"])] {
				want = append(want, f)
			}
		}
		for _, in := range c.Inputs {
			format, ok := kernelFormats[in.Format]
			if !ok {
				continue
			}
			out = append(out, kernelCase{dir: dir, file: in.File, format: format, expected: want})
		}
	}
	return out
}

// TestCases runs every kernel-log input of the case corpus, each file on its
// own, through kmsg.ParseText (in the format expected.yaml names, and in auto
// detection), the Detector and Aggregate, and compares the result with the
// case's expected findings under the corpus rules: detector, gpu_pci, xid and
// count always, plus every other key the expected finding gives; a finding
// not expected is a failure.
func TestCases(t *testing.T) {
	t.Parallel()
	cases := loadKernelCases(t)
	seen := map[string]bool{}
	for _, kc := range cases {
		seen[filepath.Base(kc.dir)[:3]] = true
		for _, format := range []kmsg.Format{kc.format, kmsg.FormatAuto} {
			name := filepath.Base(kc.dir) + "/" + kc.file + "/" + string(format)
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f, err := os.Open(filepath.Join(kc.dir, kc.file))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				recs, stats, err := kmsg.ParseText(f, format, kmsg.TextOptions{})
				if err != nil {
					t.Fatalf("ParseText: %v", err)
				}
				if stats.Unparsed != 0 {
					t.Errorf("ParseText: %d unparsed lines, want 0 (stats %+v)", stats.Unparsed, stats)
				}
				d := detect.New(detect.Options{Node: "node-a1", BootID: "boot-1"})
				events := d.ScanRecords(recs)
				got := detect.Aggregate(events)
				for _, g := range got {
					if g.ID == "" || g.Node != "node-a1" || g.BootID != "boot-1" || len(g.Evidence) == 0 || g.Count < 1 {
						t.Errorf("incomplete finding %+v", g)
					}
				}
				casecheck.CompareFindings(t, kc.expected, got)
			})
		}
	}
	for _, id := range []string{"c01", "c02", "c03", "c04", "c05", "c09", "c18"} {
		if !seen[id] {
			t.Errorf("case %s has no kernel-log input in %s", id, casesDir)
		}
	}
}
