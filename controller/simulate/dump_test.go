package simulate

import (
	"io/fs"
	"os"
	"path/filepath"
	"time"
	"testing"

	"github.com/fleetrepair/fleetrepair/test/fixtures"
)

func TestDump(t *testing.T) {
	paths, _ := fs.Glob(fixtures.Cases, "cases/*/scenario.yaml")
	var rs []*Result
	for _, p := range paths {
		sc, err := LoadFS(fixtures.Cases, p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(sc, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, res)

	}
	syn, _ := filepath.Glob("testdata/*.yaml")
	for _, p := range syn {
		sc, err := LoadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		res, err := Run(sc, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s took %s pass=%v", p, time.Since(start), res.Pass)
		for _, c := range append(res.Checkpoints, res.Expectations...) {
			if c.Status != "pass" {
				t.Logf("  %+v", c)
			}
		}
		for _, tr := range res.Policies[0].Trips {
			t.Logf("  trip %s %s %s %s", tr.At, tr.Cohort, tr.Change, tr.Message)
		}
		t.Logf("  halted %d", len(res.Halted))
		rs = append(rs, res)
	}
	WriteTable(os.Stdout, rs)
}
