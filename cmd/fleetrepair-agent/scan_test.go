package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

const cases = "../../test/fixtures/cases"

// runCLI runs the command line and returns stdout, stderr and the exit code.
func runCLI(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, streams{in: strings.NewReader(stdin), out: &out, err: &errOut})
	code := exitCode(err, &errOut)
	return out.String(), errOut.String(), code
}

// decode parses JSON lines into findings.
func decode(t *testing.T, out string) []finding.Finding {
	t.Helper()
	var fs []finding.Finding
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var f finding.Finding
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("output line %q is not a finding: %v", line, err)
		}
		fs = append(fs, f)
	}
	return fs
}

func TestScan(t *testing.T) {
	t.Parallel()
	c04 := filepath.Join(cases, "c04-xid45-secondary-to-nvlink", "input.kmsg.txt")
	c02 := filepath.Join(cases, "c02-fallen-off-bus-no-xid", "input.devkmsg.txt")
	c13 := filepath.Join(cases, "c13-nvlink-inactive-links", "input.nvidia-smi.txt")
	c06 := filepath.Join(cases, "c06-remapped-rows-pending", "input.nvidia-smi.txt")
	c15 := filepath.Join(cases, "c15-dcgmi-diag-faulty-memory", "input.dcgmi-diag.collapsed.txt")
	c16 := filepath.Join(cases, "c16-dcgm-exporter-xid-gauge", "input.metrics-windowed.prom")
	c19 := filepath.Join(cases, "c19-kubelet-pleg-not-healthy", "input.kubelet.log")
	c08 := filepath.Join(cases, "c08-xid95-uncontained-health-event", "input.health-monitor.log")
	c14 := filepath.Join(cases, "c14-allocatable-short-after-xid94", "input.node-describe.txt")
	c24 := filepath.Join(cases, "c24-driver-library-version-mismatch", "input.apt-history.log")
	c27 := filepath.Join(cases, "c27-nodeclaim-stuck-terminating", "input.node.yaml")
	c02text, err := os.ReadFile(c02)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		stdin     string
		args      []string
		code      int
		findings  int    // JSON lines on stdout
		count     int    // sum of Count
		stderrHas string // substring of stderr
	}{
		{name: "aggregated per file", args: []string{"scan", "--node", "node-a1", c04}, findings: 4, count: 8, stderrHas: "8 records, 0 unparsed"},
		{name: "one finding per event", args: []string{"scan", "--events", c04}, findings: 8, count: 8},
		{name: "explicit format", args: []string{"scan", "--format", "journalctl-k", c04}, findings: 4, count: 8},
		{name: "kmsg alias", args: []string{"scan", "--format", "kmsg", c02}, findings: 3, count: 3},
		{name: "stdin", stdin: string(c02text), args: []string{"scan", "-"}, findings: 3, count: 3, stderrHas: "scan -:"},
		{name: "several files", args: []string{"scan", c02, c04}, findings: 7, count: 11},
		{name: "unparsed lines are counted", stdin: "garbage line\nNVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n",
			args: []string{"scan", "--format", "dmesg", "-"}, findings: 1, count: 1, stderrHas: "2 unparsed lines"},
		{name: "no findings still exits 0", stdin: "[ 1.000000] eth0: link up\n", args: []string{"scan", "-"}, stderrHas: "0 findings"},
		{name: "nvidia-smi detected", args: []string{"scan", c13}, findings: 1, count: 2, stderrHas: "nvidia-smi, 9 lines, 1 findings"},
		{name: "corpus format name", args: []string{"scan", "--format", "nvidia-smi-q", c06}, findings: 1, count: 1},
		{name: "dcgmi diag collapsed", args: []string{"scan", c15}, findings: 2, count: 2, stderrHas: "dcgmi-diag"},
		{name: "exporter metrics", args: []string{"scan", c16}, findings: 1, count: 1, stderrHas: "prometheus"},
		{name: "kubelet log", args: []string{"scan", c19}, findings: 1, count: 5, stderrHas: "runtime-log"},
		{name: "health event json", args: []string{"scan", c08}, findings: 1, count: 1, stderrHas: "json-log"},
		{name: "mixed files", args: []string{"scan", c04, c13, c19}, findings: 6, count: 15},
		{name: "nvidia-smi from stdin", stdin: "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost\n",
			args: []string{"scan", "-"}, findings: 1, count: 1},
		{name: "describe node", args: []string{"scan", c14}, findings: 1, count: 1, stderrHas: "kubectl-describe, 16 lines, 1 findings"},
		{name: "node yaml is not scanned", args: []string{"scan", c27}, code: exitError, stderrHas: "NOT SCANNED: scan: the input is a Kubernetes Node"},
		{name: "apt history is not scanned", args: []string{"scan", c24}, code: exitError, stderrHas: "is in no format scan reads (kernel logs"},
		{name: "oversized xid is rejected", stdin: "NVRM: Xid (PCI:0000:01:00): 99999999999999999999, pid=1\n", args: []string{"scan", "-"},
			stderrHas: `1 driver lines rejected (a number out of range; no finding made), last: parse xid "99999999999999999999": not in 1..99999`},
		{name: "kernel format on other text warns", stdin: "hello\n", args: []string{"scan", "--format", "kernel", "-"},
			stderrHas: "warning: none of its 1 lines is a kernel log record"},
		{name: "unknown flag", args: []string{"scan", "--nope", c04}, code: exitUsage, stderrHas: "unknown flag: --nope"},
		{name: "bad format", args: []string{"scan", "--format", "xml", c04}, code: exitUsage, stderrHas: `parse format "xml"`},
		{name: "no file", args: []string{"scan"}, code: exitUsage, stderrHas: "at least one FILE"},
		{name: "stdin twice", args: []string{"scan", "-", "-"}, code: exitUsage, stderrHas: "given twice"},
		{name: "missing file", args: []string{"scan", c04, "/nonexistent/kern.log"}, code: exitError, stderrHas: "/nonexistent/kern.log: no such file"},
		{name: "bad rules file", args: []string{"scan", "--rules", "/nonexistent/rules.yaml", c04}, code: exitError, stderrHas: "load rules"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, errOut, code := runCLI(t, tt.stdin, tt.args...)
			if code != tt.code {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, tt.code, errOut)
			}
			if !strings.Contains(errOut, tt.stderrHas) {
				t.Errorf("stderr %q lacks %q", errOut, tt.stderrHas)
			}
			if tt.code != exitOK {
				if out != "" {
					t.Errorf("stdout on failure: %q", out)
				}
				return
			}
			fs := decode(t, out)
			count := 0
			for _, f := range fs {
				count += f.Count
				if f.ID == "" || len(f.Evidence) == 0 {
					t.Errorf("incomplete finding %+v", f)
				}
			}
			if len(fs) != tt.findings || count != tt.count {
				t.Errorf("%d findings with count %d, want %d with %d:\n%s", len(fs), count, tt.findings, tt.count, out)
			}
		})
	}
}

// TestScanUnrecognizedAmongOthers: a file in no format is named on standard
// error and makes the exit status 1; the other files are still scanned.
func TestScanUnrecognizedAmongOthers(t *testing.T) {
	t.Parallel()
	c04 := filepath.Join(cases, "c04-xid45-secondary-to-nvlink", "input.kmsg.txt")
	apt := filepath.Join(cases, "c24-driver-library-version-mismatch", "input.apt-history.log")
	out, errOut, code := runCLI(t, "", "scan", apt, c04)
	if code != exitError || len(decode(t, out)) != 4 || !strings.Contains(errOut, "1 of 2 inputs in no format scan reads ("+apt+")") {
		t.Errorf("code %d, %d findings, stderr:\n%s", code, len(decode(t, out)), errOut)
	}
}

func TestScanNodeFromFlag(t *testing.T) {
	t.Parallel()
	out, _, code := runCLI(t, "[ 1.0] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n",
		"scan", "--node", "node-b7", "--boot-id", "b-1", "-")
	fs := decode(t, out)
	if code != 0 || len(fs) != 1 || fs[0].Node != "node-b7" || fs[0].BootID != "b-1" || fs[0].Xid != 79 || fs[0].GPUPCI != "0000:01:00.0" {
		t.Errorf("code %d, findings %+v", code, fs)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	out, _, code := runCLI(t, "", "scan", "--help")
	if code != 0 || !strings.Contains(out, "--format") || !strings.Contains(out, "journalctl-k") {
		t.Errorf("help: code %d\n%s", code, out)
	}
}

// TestRunRefusesBadIntervals: a zero heartbeat interval or a negative GPU
// count is a usage error at start, not an agent that never reports or that
// expects no GPUs.
func TestRunRefusesBadIntervals(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--heartbeat-interval", "0s"}, {"--expected-gpus", "-3"}} {
		_, errOut, code := runCLI(t, "", append([]string{"run", "--controller", "http://127.0.0.1:1", "--cluster", "c", "--node", "n"}, args...)...)
		if code != 2 || !strings.Contains(errOut, args[0]) {
			t.Errorf("%v: code %d, stderr %q; want a usage error naming the flag", args, code, errOut)
		}
	}
}
