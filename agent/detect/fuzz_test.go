package detect_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// FuzzDetect parses arbitrary text in auto mode and runs it through the
// Detector, Expire, Flush and Aggregate. Seeds are the corpus inputs.
func FuzzDetect(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(casesDir, "*", "input.*kmsg.txt"))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(data), int64(0))
		for _, line := range strings.Split(string(data), "\n") {
			f.Add(line, int64(1))
		}
	}
	f.Fuzz(func(t *testing.T, input string, step int64) {
		recs, _, err := kmsg.ParseText(strings.NewReader(input), kmsg.FormatAuto, kmsg.TextOptions{Location: time.UTC, Year: 2024})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(0, 0)
		d := detect.New(detect.Options{Node: "n", Now: func() time.Time { return now }})
		var all []finding.Finding
		for _, r := range recs {
			all = append(all, d.Feed(r)...)
			now = now.Add(time.Duration(step%5000) * time.Millisecond)
			all = append(all, d.Expire(now)...)
		}
		all = append(all, d.Flush()...)
		if st := d.Stats(); st.Held != 0 || st.Records != uint64(len(recs)) {
			t.Errorf("stats after Flush: %+v", st)
		}
		check := func(fs []finding.Finding) {
			for _, f := range fs {
				if err := valid(f); err != nil {
					t.Errorf("%v: %+v", err, f)
				}
			}
		}
		check(all)
		agg := detect.Aggregate(all)
		check(agg)
		n := 0
		for _, f := range agg {
			n += f.Count
		}
		if n != len(all) {
			t.Errorf("aggregate counts %d events, want %d", n, len(all))
		}
	})
}

// valid checks what the controller's Report.Validate requires of a finding.
func valid(f finding.Finding) error {
	r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c", Node: "n", BootID: "b", Findings: []finding.Finding{f}}
	if err := r.Validate(); err != nil {
		return err
	}
	if len(f.Evidence) == 0 {
		return fmt.Errorf("no evidence")
	}
	return nil
}
