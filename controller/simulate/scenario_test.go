package simulate

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseOffset(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   any
		want time.Duration
		err  bool
	}{
		{"0m", 0, false},
		{"0s", 0, false},
		{float64(0), 0, false},
		{"90s", 90 * time.Second, false},
		{"5m", 5 * time.Minute, false},
		{"24h", 24 * time.Hour, false},
		{"8d", 8 * 24 * time.Hour, false},
		{"1d12h", 36 * time.Hour, false},
		{"1h30m", 90 * time.Minute, false},
		{"5x", 0, true},
		{"-5m", 0, true},
		{"d", 0, true},
		{float64(5), 0, true},
	} {
		got, err := parseOffset(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("parseOffset(%v) = %s, %v; want %s, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

const minimal = `
scenario: test
fleet:
  nodepools:
    - {name: p, zones: {zone-a: 2, zone-b: 1}, node_name_prefix: "n", driver_version: 580.1, kernel: 6.8, instance_type: x}
`

func TestParse(t *testing.T) {
	t.Parallel()
	sc, err := Parse([]byte(minimal + `
seed: 7
parameters: {repair_toleration: 10m, tick: 1m, deletions_per_hour: 3, breaker: {window: 5m, labels: [rack]}}
clock: {t0: "03:51"}
findings_template: &f
  - {detector: xid, xid: 79, gpu_pci: "0000:4e:00.0", count: 2, pid: 42}
timeline:
  - {at: 3m-20m, repeat_every: 3m, kind: inject, select: {zone: [zone-a, zone-b], count: "50%"}, findings: *f}
  - {at: 90s, kind: change, select: {nodes: [n1], count: all}, set: {driver_version: 580.2, kernel: 6.8}}
  - {at: 1d, kind: recover, select: {driver_version: "580.2"}, method: reboot}
  - {at: 2d, kind: checkpoint, expect: {deletions: 0}}
  - {at: 2d, kind: resume, cohort: zone=zone-a}
`))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != "test" || sc.Seed != 7 || sc.T0.Hour() != 3 || sc.T0.Minute() != 51 {
		t.Errorf("header: %+v", sc)
	}
	p := sc.Parameters
	if p.RepairToleration != 10*time.Minute || p.Tick != time.Minute || p.DeletionsPerHour != 3 || !p.HaltRollouts ||
		p.Breaker.Window != 5*time.Minute || !slices.Equal(p.Breaker.Labels, []string{"rack"}) || p.ReplaceDuration != 10*time.Minute {
		t.Errorf("parameters: %+v", p)
	}
	np := sc.Fleet.NodePools[0]
	if np.Attrs["driver_version"] != "580.1" || np.Attrs["instance_type"] != "x" || np.Zones["zone-a"] != 2 || np.Prefix != "n" {
		t.Errorf("nodepool: %+v", np)
	}
	inj := sc.Timeline[0]
	if got := inj.Times(); len(got) != 6 || got[0] != 3*time.Minute || got[5] != 18*time.Minute {
		t.Errorf("range 3m-20m every 3m: %v", got)
	}
	if inj.Select.Count.Percent != 50 || !slices.Equal(inj.Select.Attrs["zone"], []string{"zone-a", "zone-b"}) {
		t.Errorf("select: %+v", inj.Select)
	}
	if f := inj.Findings[0]; f["xid"] != float64(79) || f["count"] != float64(2) {
		t.Errorf("alias not resolved: %+v", inj.Findings)
	}
	if ch := sc.Timeline[1]; ch.At != 90*time.Second || ch.Set["driver_version"] != "580.2" || ch.Set["kernel"] != "6.8" || !ch.Select.Count.All {
		t.Errorf("change: %+v", ch)
	}
	if rc := sc.Timeline[2]; rc.At != 24*time.Hour || rc.Method != MethodReboot {
		t.Errorf("recover: %+v", rc)
	}
	if rs := sc.Timeline[4]; rs.Cohort != "zone=zone-a" || rs.Actor != "oncall" {
		t.Errorf("resume: %+v", rs)
	}
	nodes := buildNodes(sc)
	if len(nodes) != 3 || nodes[0].name != "n1" || nodes[2].name != "n3" || nodes[2].attrs["zone"] != "zone-b" || nodes[0].attrs["cluster"] != "sim" {
		t.Errorf("nodes: %v %v", nodes[0], nodes[2])
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, yaml, want string
	}{
		{"no name", "fleet: {nodepools: [{name: p, zones: {a: 1}}]}\ntimeline: [{at: 0m, kind: checkpoint, expect: {deletions: 0}}]", "`scenario`"},
		{"no fleet", "scenario: x\ntimeline: [{at: 0m, kind: checkpoint, expect: {deletions: 0}}]", "fleet: required"},
		{"empty timeline", minimal, "timeline is empty"},
		{"unknown kind", minimal + "timeline: [{at: 0m, kind: explode, select: {count: 1}}]", "kind \"explode\""},
		{"unknown step key", minimal + "timeline: [{at: 0m, kind: checkpoint, expect: {deletions: 0}, expected: 1}]", "unknown field"},
		{"range without repeat", minimal + "timeline: [{at: 3m-20m, kind: checkpoint, expect: {deletions: 0}}]", "needs repeat_every"},
		{"backwards range", minimal + "timeline: [{at: 20m-3m, repeat_every: 1m, kind: checkpoint, expect: {deletions: 0}}]", "ends before"},
		{"inject without select", minimal + "timeline: [{at: 0m, kind: inject, findings: [{detector: xid, xid: 79}]}]", "select is required"},
		{"inject without findings", minimal + "timeline: [{at: 0m, kind: inject, select: {count: 1}}]", "findings are required"},
		{"finding without detector", minimal + "timeline: [{at: 0m, kind: inject, select: {count: 1}, findings: [{xid: 79}]}]", "detector is required"},
		{"unknown method", minimal + "timeline: [{at: 0m, kind: recover, select: {count: 1}, method: pray}]", "method \"pray\""},
		{"bad count", minimal + "timeline: [{at: 0m, kind: recover, select: {count: some}, method: reboot}]", "count"},
		{"unknown parameter", minimal + "parameters: {tolerance: 5m}\ntimeline: [{at: 0m, kind: checkpoint, expect: {deletions: 0}}]", "unknown parameter"},
		{"bad truth", minimal + "timeline: [{at: 0m, kind: inject, truth: maybe, select: {count: 1}, findings: [{detector: xid}]}]", "truth"},
		{"bad zone count", "scenario: x\nfleet: {nodepools: [{name: p, zones: {a: many}}]}\ntimeline: [{at: 0m, kind: checkpoint, expect: {deletions: 0}}]", "node count"},
		{"not yaml", "scenario: [", "decode scenario"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestFmtOffset(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", 90 * time.Second: "1m30s", 5 * time.Minute: "5m", time.Hour: "1h", 90 * time.Minute: "1h30m",
		192 * time.Hour: "192h", time.Hour + 30*time.Second: "1h0m30s",
	} {
		if got := fmtOffset(d); got != want {
			t.Errorf("fmtOffset(%s) = %q, want %q", d, got, want)
		}
	}
}
