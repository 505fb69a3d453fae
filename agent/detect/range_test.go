package detect

import (
	"errors"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// TestOutOfRangeNumbersRejected: a driver line whose number does not fit its
// field is rejected with a reason, never read with the number cut to the
// digits a pattern captured (99999999999999999999 once became Xid 99999).
func TestOutOfRangeNumbersRejected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line, reason string
	}{
		{"NVRM: Xid (PCI:0000:01:00): 99999999999999999999, pid=1", `parse xid "99999999999999999999"`},
		{"NVRM: Xid (PCI:0000:01:00): 100000, pid=1", `parse xid "100000": not in 1..99999`},
		{"NVRM: Xid (PCI:0000:01:00): 45, pid=1, name=p, Ch 00000001 caused by previous Xid 1234567", `parse caused-by xid "1234567"`},
		{"NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 99999 (0x0)", `parse link "99999"`},
		{"nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 120280000, Non-fatal, Link 62 egress non-posted PRIV error (First)", `parse sxid "120280000"`},
		{"nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 6200 egress non-posted PRIV error (First)", `parse link "6200"`},
	}
	for _, tt := range tests {
		d := New(Options{})
		fs := d.ScanRecords([]kmsg.Record{{Usec: 1, Message: tt.line, Raw: tt.line}})
		if len(fs) != 0 {
			t.Errorf("%q: findings %+v, want none (rejected)", tt.line, fs)
		}
		st := d.Stats()
		if st.Rejected != 1 || !strings.Contains(st.LastRejected, tt.reason) || !strings.Contains(st.LastRejected, "out of range") {
			t.Errorf("%q: rejected %d (%q), want 1 with reason %q", tt.line, st.Rejected, st.LastRejected, tt.reason)
		}
	}
	// The largest numbers in range still parse.
	d := New(Options{})
	line := "NVRM: Xid (PCI:0000:01:00): 99999, pid=1"
	fs := d.ScanRecords([]kmsg.Record{{Usec: 1, Message: line, Raw: line}})
	if len(fs) != 1 || fs[0].Xid != 99999 || d.Stats().Rejected != 0 {
		t.Errorf("Xid 99999: findings %+v, rejected %d; want one Xid 99999", fs, d.Stats().Rejected)
	}
}

func TestParseNumber(t *testing.T) {
	t.Parallel()
	if n, err := finding.ParseNumber("xid", "079", 1, finding.MaxXid); err != nil || n != 79 {
		t.Errorf("079 = %d, %v", n, err)
	}
	for _, s := range []string{"0", "100000", "99999999999999999999999999"} {
		if _, err := finding.ParseNumber("xid", s, 1, finding.MaxXid); !errors.Is(err, finding.ErrOutOfRange) {
			t.Errorf("%s: err %v, want ErrOutOfRange", s, err)
		}
	}
	for _, s := range []string{"", "-1", "1e3", "12a"} {
		if _, err := finding.ParseNumber("xid", s, 1, finding.MaxXid); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}
