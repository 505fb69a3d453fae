package dcgmtext

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

func describe(f finding.Finding) string {
	s := f.Detector + " " + f.GPUPCI
	if f.Xid != 0 {
		s += " xid=" + strconv.Itoa(f.Xid)
	}
	if f.Count > 1 {
		s += " count=" + strconv.Itoa(f.Count)
	}
	keys := make([]string, 0, len(f.Attrs))
	for k := range f.Attrs {
		if k != finding.AttrMessage {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		s += " " + k + "=" + f.Attrs[k]
	}
	return s
}

func TestParseDiag(t *testing.T) {
	t.Parallel()
	table := `+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| Persistence Mode          | Skip                                           |
+-----  Integration  -------+------------------------------------------------+
| PCIe                      | Fail - GPU: 2                                  |
|                           | Pass - GPUs: 0, 1, 3                           |
| Memory Bandwidth          | Warn - GPU: 1                                  |
| Targeted Power            |
`
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"failed and warned tests", table, []string{
			"dcgm-diag  gpu_index=2 result=fail test=PCIe",
			"dcgm-diag  gpu_index=0,1,3 result=pass test=PCIe",
			"dcgm-diag  gpu_index=1 result=warn test=Memory Bandwidth",
		}},
		{"all pass", "| Diagnostic | Result |\n| GPU Memory | Pass - All |\n", nil},
		{"empty", "", nil},
		{"not a table", "Error: unable to connect to host engine\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fs, err := ParseDiag(strings.NewReader(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range fs {
				got = append(got, describe(f))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"last value", `DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-x",pci_bus_id="00000000:3B:00.0"} 79`,
			[]string{"dcgm-metric 0000:3b:00.0 xid=79 gpu_index=1 gpu_uuid=GPU-x metric=DCGM_FI_DEV_XID_ERRORS"}},
		{"zero is no Xid", `DCGM_FI_DEV_XID_ERRORS{gpu="0"} 0`, nil},
		{"windowed zero", `DCGM_FI_DEV_XID_ERRORS_ACTIVE{gpu="0",xid="13"} 0`, nil},
		{"windowed count", `DCGM_FI_DEV_XID_ERRORS_ACTIVE{gpu="0",xid="13",window_size_in_ms="60000"} 3`,
			[]string{"dcgm-metric  xid=13 count=3 gpu_index=0 metric=DCGM_FI_DEV_XID_ERRORS_ACTIVE window_ms=60000"}},
		{"other metrics", "# HELP DCGM_FI_DEV_GPU_TEMP x\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 40\n", nil},
		{"escaped label", `DCGM_FI_DEV_XID_ERRORS{err_msg="a \"b\", c",gpu="2"} 31`,
			[]string{"dcgm-metric  xid=31 gpu_index=2 metric=DCGM_FI_DEV_XID_ERRORS"}},
		{"broken line", `DCGM_FI_DEV_XID_ERRORS{gpu="2 31`, nil},
		// Out-of-range numbers are not read as an Xid cut to what fits.
		{"oversized value", `DCGM_FI_DEV_XID_ERRORS{gpu="0"} 1e20`, nil},
		{"fractional value", `DCGM_FI_DEV_XID_ERRORS{gpu="0"} 79.5`, nil},
		{"oversized xid label", `DCGM_FI_DEV_XID_ERRORS_ACTIVE{gpu="0",xid="99999999999999999999"} 1`, nil},
		{"oversized count", `DCGM_FI_DEV_XID_ERRORS_ACTIVE{gpu="0",xid="13"} 1e12`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fs, err := ParseMetrics(strings.NewReader(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range fs {
				got = append(got, describe(f))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

// TestDedupStickyGauge checks that an unchanged gauge, scraped again and
// again, is one finding, and that a change is reported (c16).
func TestDedupStickyGauge(t *testing.T) {
	t.Parallel()
	var d Dedup
	var reported []int
	for _, v := range []string{"45", "45", "45", "62", "62", "45"} {
		fs, _ := ParseMetrics(strings.NewReader(`DCGM_FI_DEV_XID_ERRORS{gpu="0"} ` + v))
		for _, f := range fs {
			if d.Changed(f) {
				reported = append(reported, f.Xid)
			}
		}
	}
	if !slices.Equal(reported, []int{45, 62, 45}) {
		t.Errorf("reported %v, want [45 62 45]", reported)
	}
}

func TestParseHealthEvents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"plain event", `{"errorCode":["DCGM_FR_NVLINK_DOWN"],"isFatal":false,"message":"NVLink down","entitiesImpacted":[{"entityType":"GPU","entityValue":"3"}]}`,
			[]string{"dcgm-health  error_code=DCGM_FR_NVLINK_DOWN fatal=false gpu_index=3"}},
		{"xid in message", `{"time":"2026-01-01T00:00:00Z","errorCode":[],"isFatal":true,"message":"GPU had XID 79","entitiesImpacted":[{"entityType":"PCI","entityValue":"0000:3B:00.0"}]}`,
			[]string{"dcgm-health 0000:3b:00.0 xid=79 fatal=true"}},
		{"no event", `{"level":"info","msg":"started"}`, nil},
		{"not json", "hello\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fs, err := ParseHealthEvents(strings.NewReader(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range fs {
				got = append(got, describe(f))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}
