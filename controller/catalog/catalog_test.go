package catalog_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
)

// released is a snapshot of a released catalog: the fields automation
// downstream relies on.
type released struct {
	Version string `json:"version"`
	Reasons []struct {
		Code          string `json:"code"`
		Severity      string `json:"severity"`
		FaultClass    string `json:"faultClass"`
		Action        string `json:"action"`
		ConditionType string `json:"conditionType,omitempty"`
	} `json:"reasons"`
}

func major(v string) int {
	n, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	return n
}

// TestContract fails when a released reason code disappears or changes
// severity, fault class, action or condition type without a major version
// bump of the catalog. A release adds its snapshot to testdata/.
func TestContract(t *testing.T) {
	t.Parallel()
	snaps, err := filepath.Glob("testdata/released-*.json")
	if err != nil || len(snaps) == 0 {
		t.Fatalf("no released snapshots in testdata: %v", err)
	}
	cur := catalog.Default()
	for _, p := range snaps {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var snap released
		if err := json.Unmarshal(b, &snap); err != nil {
			t.Fatalf("decode %s: %v", p, err)
		}
		if major(cur.Version) > major(snap.Version) {
			continue // a major bump may break the older contract
		}
		for _, want := range snap.Reasons {
			got, ok := cur.Lookup(want.Code)
			if !ok {
				t.Errorf("released code %s (catalog %s) disappeared without a major version bump", want.Code, snap.Version)
				continue
			}
			if string(got.Severity) != want.Severity || got.FaultClass != want.FaultClass || string(got.Action) != want.Action || got.ConditionType != want.ConditionType {
				t.Errorf("released code %s changed meaning without a major version bump: was %s/%s/%s/%s, now %s/%s/%s/%s",
					want.Code, want.Severity, want.FaultClass, want.Action, want.ConditionType,
					got.Severity, got.FaultClass, got.Action, got.ConditionType)
			}
		}
	}
}

// TestGeneratedFilesUpToDate fails when reasons_gen.go or docs/reasons.md
// drifted from reasons.yaml: run `make generate`.
func TestGeneratedFilesUpToDate(t *testing.T) {
	t.Parallel()
	c := catalog.Default()
	src, err := catalog.GenerateGo(c)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]byte{"reasons_gen.go": src, "../../docs/reasons.md": catalog.GenerateMarkdown(c)} {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is out of date with reasons.yaml: run `make generate`", path)
		}
	}
	if catalog.Version != c.Version {
		t.Errorf("generated Version %s, catalog %s", catalog.Version, c.Version)
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	valid := "version: 1.0.0\nreasons:\n  - {code: Good, severity: event, faultClass: none, action: none, since: 1.0.0, description: d, runbook: r}\n"
	if _, err := catalog.Parse([]byte(valid)); err != nil {
		t.Fatalf("valid catalog rejected: %v", err)
	}
	for name, doc := range map[string]string{
		"bad version":    strings.Replace(valid, "version: 1.0.0", "version: one", 1),
		"unknown field":  strings.Replace(valid, "runbook: r}", "runbook: r, colour: red}", 1),
		"bad code":       strings.Replace(valid, "code: Good", "code: not-camel", 1),
		"bad severity":   strings.Replace(valid, "severity: event", "severity: loud", 1),
		"bad action":     strings.Replace(valid, "action: none", "action: explode", 1),
		"bad class":      strings.Replace(valid, "faultClass: none", "faultClass: cosmic-ray", 1),
		"no cond type":   strings.Replace(valid, "severity: event", "severity: condition", 1),
		"bad toleration": strings.Replace(valid, "action: none", "action: none, toleration: soon", 1),
		"duplicate":      valid + "  - {code: Good, severity: event, faultClass: none, action: none, since: 1.0.0, description: d, runbook: r}\n",
		"no runbook":     strings.Replace(valid, ", runbook: r", "", 1),
		"bad replacedBy": strings.Replace(valid, "runbook: r}", "runbook: r, deprecated: true, replacedBy: Nope}", 1),
	} {
		if _, err := catalog.Parse([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestDefaultTolerations(t *testing.T) {
	t.Parallel()
	c := catalog.Default()
	for code, want := range map[string]string{catalog.ReasonGPULost: "10m0s", catalog.ReasonContainerRuntimeNotReady: "30m0s"} {
		if got := c.MustLookup(code).TolerationDuration().String(); got != want {
			t.Errorf("%s toleration %s, want %s", code, got, want)
		}
	}
}
