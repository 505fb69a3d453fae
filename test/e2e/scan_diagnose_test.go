package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestScanPipeDiagnose runs `fleetrepair-agent scan FILE | fleetrepair
// diagnose -` on every kernel-log input of the corpus, as an SRE would, and
// compares the first diagnosis with the case's expected severity, fault
// class and action.
func TestScanPipeDiagnose(t *testing.T) {
	t.Parallel()
	dirs, err := filepath.Glob(filepath.Join(fixture(t, ""), "c*"))
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "expected.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			ID     string `json:"id"`
			Kind   string `json:"kind"`
			Inputs []struct {
				File   string `json:"file"`
				Format string `json:"format"`
			} `json:"inputs"`
			Diagnosis struct {
				Severity   string `json:"severity"`
				FaultClass string `json:"fault_class"`
				Action     string `json:"action"`
			} `json:"diagnosis"`
		}
		if err := yaml.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		if c.Kind != "kernel-log" {
			continue
		}
		for _, in := range c.Inputs {
			if in.Format == "" || strings.HasPrefix(in.Format, "nvidia-smi") {
				continue
			}
			ran++
			t.Run(c.ID+"/"+in.File, func(t *testing.T) {
				t.Parallel()
				scan := exec.Command(agentBin, "scan", "--node", "node-a1", filepath.Join(dir, in.File))
				findings, err := scan.Output()
				if err != nil {
					t.Fatalf("scan: %v", err)
				}
				diag := exec.Command(controllerBin, "diagnose", "-")
				diag.Stdin = bytes.NewReader(findings)
				out, err := diag.Output()
				if err != nil {
					t.Fatalf("diagnose: %v", err)
				}
				sc := bufio.NewScanner(bytes.NewReader(out))
				if !sc.Scan() {
					t.Fatalf("diagnose printed nothing for findings:\n%s", findings)
				}
				var d struct{ Severity, FaultClass, Action, Reason string }
				if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
					t.Fatal(err)
				}
				if d.Severity != c.Diagnosis.Severity || d.FaultClass != c.Diagnosis.FaultClass || d.Action != c.Diagnosis.Action {
					t.Fatalf("first diagnosis %s/%s/%s (%s), want %s/%s/%s", d.Severity, d.FaultClass, d.Action, d.Reason,
						c.Diagnosis.Severity, c.Diagnosis.FaultClass, c.Diagnosis.Action)
				}
			})
		}
	}
	if ran < 9 {
		t.Fatalf("only %d kernel-log inputs found", ran)
	}
}
