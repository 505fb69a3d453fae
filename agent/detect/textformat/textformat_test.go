package textformat

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

func TestSniff(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Format
	}{
		{"[ 1.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1", KernelLog},
		{"6,1,2,-;NVRM: loading", KernelLog},
		{"Mar 13 16:02:43 node-a1 kernel: [ 1.0] NVRM: x", KernelLog},
		{"Mar 13 16:02:43 node-a1 kubelet[1450]: I0313 x", RuntimeLog},
		{"I1025 02:19:08.002792       1 health.go:151] x", RuntimeLog},
		{`{"level":"info"}`, JSONLog},
		{"# HELP DCGM_FI_DEV_XID_ERRORS x\n", Prometheus},
		{"Successfully ran diagnostic for group.\n| Diagnostic | Result |", DcgmiDiag},
		{"GPU 3: Tesla V100\n Link 3: <inactive>", NvidiaSMI},
		{"", KernelLog},
	}
	for _, tt := range tests {
		if got := Sniff([]byte(tt.in)); got != tt.want {
			t.Errorf("Sniff(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseFormat(t *testing.T) {
	t.Parallel()
	for _, f := range Formats() {
		got, err := ParseFormat(string(f))
		if err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %q, %v", f, got, err)
		}
	}
	for alias, want := range aliases {
		if got, err := ParseFormat(alias); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %q, %v; want %q", alias, got, err, want)
		}
	}
	if _, err := ParseFormat("xml"); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("ParseFormat(xml) error %v, want ErrUnknownFormat", err)
	}
}

// FuzzScan checks that no input crashes any parser.
func FuzzScan(f *testing.F) {
	for _, s := range []string{"| a | b |\n| | Fail - GPU: 0 |", `{"errorCode":["x"],"entitiesImpacted":[{`, "GPU 0: x\n Link 0: <inactive>",
		"DCGM_FI_DEV_XID_ERRORS{a=\"", "PLEG is not healthy: pleg was last seen active 9h ago; threshold is 3m0s"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, format := range []Format{NvidiaSMI, DcgmiDiag, Prometheus, JSONLog, RuntimeLog, KernelLog} {
			if _, err := Scan(context.Background(), bytes.NewReader(data), format, Options{}); err != nil {
				t.Fatalf("Scan %s: %v", format, err)
			}
		}
	})
}
