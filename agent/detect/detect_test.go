package detect

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

func TestParseXid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line string
		want xidLine
		ok   bool
	}{
		{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
			xidLine{pci: "0000:02:00.0", xid: 79, text: "GPU has fallen off the bus."}, true},
		{"NVRM: Xid (0000:3B:00): 79, pid=1234, GPU has fallen off the bus.",
			xidLine{pci: "0000:3b:00.0", xid: 79, pid: "1234", text: "GPU has fallen off the bus."}, true},
		{"NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
			xidLine{pci: "0000:cb:00.0", xid: 13, text: "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"}, true},
		{"NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
			xidLine{pci: "0000:cb:00.0", xid: 109, pid: "1797828", process: "pt_main_thread", text: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"}, true},
		{"NVRM: Xid (PCI:0000:01:00): 45, pid=12542, name=VLLM::Worker, channel 0x00000002",
			xidLine{pci: "0000:01:00.0", xid: 45, pid: "12542", process: "VLLM::Worker", text: "channel 0x00000002"}, true},
		{"kernel: [  219.47] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
			xidLine{pci: "0000:07:00.0", xid: 48, text: "An uncorrectable double bit error"}, true},
		{"NVRM: Xid (PCI:0000:07:00.1): 94", xidLine{pci: "0000:07:00.1", xid: 94}, true},
		{"NVRM: Xid (PCI:zzzz:07:00): 94, x", xidLine{}, false},
		{"NVRM: Xid (PCI:0000:07:00): 0, x", xidLine{}, false},
		{"NVRM: Xid (PCI:0000:07:00): , x", xidLine{}, false},
		{"NVRM: GPU at PCI:0000:02:00: GPU-00000000-0000-0000-0000-000000000001", xidLine{}, false},
	}
	for _, tt := range tests {
		got, ok, _ := parseXid(tt.line)
		if ok != tt.ok || got != tt.want {
			t.Errorf("parseXid(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

func TestXidAttrs(t *testing.T) {
	t.Parallel()
	d := New(Options{})
	tests := []struct {
		line string
		want map[string]string
	}{
		{"NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
			map[string]string{"pid": "1818990", "process": "python3", "caused_by": "149", "secondary": "true"}},
		{"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
			map[string]string{"recovery_action": "gpu-reset-required"}},
		{"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
			map[string]string{"recovery_action": "node-reboot-required"}},
		{"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x4 (Drain and Reset)",
			map[string]string{"recovery_action": "drain-and-reset"}},
		{"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
			map[string]string{"recovery_action": "drain-p2p"}},
		{"NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
			map[string]string{"pid": "13705", "process": "UnrealEditor", "engine": "GRAPHICS", "fault": "FAULT_PDE ACCESS_TYPE_VIRT_READ"}},
		// NVLink5 Xids print their severity (blind trial: a Nonfatal 145
		// was treated as fatal and the node rebooted).
		{"NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
			map[string]string{"fatal": "false", "links": "13"}},
		{"NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04 (0x00000001 0x00000000)",
			map[string]string{"fatal": "true", "links": "4"}},
	}
	for _, tt := range tests {
		x, ok, err := parseXid(tt.line)
		if !ok {
			t.Fatalf("parseXid(%q) failed: %v", tt.line, err)
		}
		got := d.xidAttrs(x)
		if len(got) != len(tt.want) {
			t.Errorf("%q: attrs %v, want %v", tt.line, got, tt.want)
		}
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("%q: %s = %q, want %q", tt.line, k, got[k], v)
			}
		}
	}
}

// fakeClock is a settable Options.Now.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// rec is a live-style record: kernel facility, monotonic time in ms.
func rec(seq uint64, ms int64, msg string) kmsg.Record {
	return kmsg.Record{Seq: seq, Prio: 3, Usec: ms * 1000, Message: msg, Raw: msg}
}

func detectors(fs []finding.Finding) string {
	var s []string
	for _, f := range fs {
		d := f.Detector
		if f.Xid != 0 {
			d += ":" + strconv.Itoa(f.Xid)
		}
		s = append(s, d)
	}
	return strings.Join(s, ",")
}

// TestCriticalFindingsAreNotHeld checks that single-line critical facts come
// out of the Feed call of their own record, even while other events are held.
func TestCriticalFindingsAreNotHeld(t *testing.T) {
	t.Parallel()
	d := New(Options{Node: "n", BootID: "b"})
	steps := []struct {
		r    kmsg.Record
		want string
	}{
		{rec(1, 0, "NVRM: Xid (PCI:0000:cb:00): 13, pid=7, name=x, Graphics SM Warp Exception"), ""},
		{rec(2, 1, "NVRM: Xid (PCI:0000:cb:00): 13, pid=7, name=x, Graphics Exception: ESR"), ""},
		{rec(3, 2, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."), "xid:79"},
		{rec(4, 3, "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."), "fallen-off-bus"},
		{rec(5, 4, "pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:00:03.0"), ""},
		{rec(6, 5, "pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)"), ""},
		{rec(7, 6, "pcieport 0000:00:03.0:    [14] CmpltTO                (First)"), ""},
		{rec(8, 7, "nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)"), ""},
		// The recovery outcome completes the AER report at once.
		{rec(9, 8, "pcieport 0000:00:03.0: AER: device recovery failed"), "aer-fatal"},
		// 1.2 s after the last Xid 13 line: that event is over.
		{rec(10, 1202, "eth0: link up"), "xid:13"},
	}
	for i, s := range steps {
		got := d.Feed(s.r)
		if detectors(got) != s.want {
			t.Fatalf("step %d (%q): Feed = %q, want %q", i, s.r.Message, detectors(got), s.want)
		}
		for _, f := range got {
			if f.ID == "" || f.Node != "n" || f.BootID != "b" || f.Seq == 0 {
				t.Errorf("step %d: incomplete finding %+v", i, f)
			}
		}
		if s.want == "aer-fatal" {
			f := got[0]
			if f.DevicePCI != "0000:00:03.0" || f.GPUPCI != "0000:03:00.0" || f.Attr(finding.AttrRecovery) != "failed" ||
				f.Attr(finding.AttrError) != "CmpltTO" || len(f.Evidence) != 5 || f.Seq != 5 {
				t.Errorf("aer finding %+v", f)
			}
		}
		if s.want == "xid:13" {
			if f := got[0]; f.Attr(finding.AttrLines) != "2" || f.Seq != 1 || f.Count != 1 || f.Attr(finding.AttrPID) != "7" {
				t.Errorf("xid 13 finding %+v", f)
			}
		}
	}
	st := d.Stats()
	if st.Records != 10 || st.Held != 0 || st.Findings["xid"] != 2 || st.Findings["aer-fatal"] != 1 || st.Findings["fallen-off-bus"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestExpireClosesHeldEvents checks the live path: a held event comes out of
// Expire once it has been held for Hold, even when no further record arrives.
func TestExpireClosesHeldEvents(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	d := New(Options{Now: clock.now, Hold: 2 * time.Second})
	d.Feed(rec(1, 0, "NVRM: Xid (PCI:0000:cb:00): 13, pid=7, name=x, a"))
	d.Feed(rec(2, 0, "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010"))
	d.Feed(rec(3, 0, "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=0010(Receiver ID)"))
	d.Feed(rec(4, 0, "pcieport 0000:00:02.0:    [ 5] Surprise Down Error    (First)"))
	d.Feed(rec(5, 0, "NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)"))
	if st := d.Stats(); st.Held != 3 {
		t.Fatalf("held %d events, want 3", st.Held)
	}
	clock.t = clock.t.Add(1999 * time.Millisecond)
	if got := d.Expire(clock.t); len(got) != 0 {
		t.Fatalf("Expire before Hold = %q", detectors(got))
	}
	clock.t = clock.t.Add(time.Millisecond)
	got := d.Expire(clock.t)
	if detectors(got) != "xid:13,aer-fatal,rminit-failed" {
		t.Fatalf("Expire = %q", detectors(got))
	}
	if got[2].Attr(finding.AttrErrorCode) != "0x24:0x72:1568" || got[2].GPUPCI != "0000:0a:00.0" {
		t.Errorf("details without attempt: %+v", got[2])
	}
	if got := d.Flush(); len(got) != 0 {
		t.Errorf("Flush after Expire = %q", detectors(got))
	}
}

// TestAttachDetailsJoinTheAttempt checks the rminit pairing (c05): the error
// code line and the attempt line that follows are one event.
func TestAttachDetailsJoinTheAttempt(t *testing.T) {
	t.Parallel()
	d := New(Options{})
	if got := d.Feed(rec(1, 0, "NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)")); len(got) != 0 {
		t.Fatalf("details alone emitted %q", detectors(got))
	}
	got := d.Feed(rec(2, 1, "NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5"))
	if len(got) != 1 || got[0].Attr(finding.AttrErrorCode) != "0x24:0x72:1568" || len(got[0].Evidence) != 2 || got[0].Seq != 1 {
		t.Fatalf("attempt = %+v", got)
	}
	// An attempt of another GPU does not take the details.
	d.Feed(rec(3, 2, "NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)"))
	got = d.Feed(rec(4, 3, "NVRM: GPU 0000:0b:00.0: rm_init_adapter failed, device minor number 6"))
	if detectors(got) != "rminit-failed" || got[0].GPUPCI != "0000:0b:00.0" || got[0].Attr(finding.AttrErrorCode) != "" {
		t.Fatalf("other GPU = %+v", got)
	}
	got = d.Flush()
	if len(got) != 1 || got[0].GPUPCI != "0000:0a:00.0" {
		t.Fatalf("Flush = %+v", got)
	}
}

// TestAERGPUFromLearnedPortAndHook checks how a correctable report, which has
// no broadcast, gets the GPU behind its port.
func TestAERGPUFromLearnedPortAndHook(t *testing.T) {
	t.Parallel()
	corrected := func(d *Detector, seq uint64, ms int64) []finding.Finding {
		out := d.Feed(rec(seq, ms, "pcieport 0000:00:02.0: AER: Corrected error received: id=0010"))
		out = append(out, d.Feed(rec(seq+1, ms, "pcieport 0000:00:02.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, id=0010(Transmitter ID)"))...)
		out = append(out, d.Feed(rec(seq+2, ms, "pcieport 0000:00:02.0:    [12] Replay Timer Timeout  "))...)
		return append(out, d.Flush()...)
	}
	d := New(Options{GPUBehindPort: func(port string) string {
		if port == "0000:00:02.0" {
			return "0000:02:00.0"
		}
		return ""
	}})
	got := corrected(d, 1, 0)
	if len(got) != 1 || got[0].Detector != finding.DetectorAERCorrectable || got[0].GPUPCI != "0000:02:00.0" || got[0].DevicePCI != "0000:00:02.0" {
		t.Fatalf("with hook: %+v", got)
	}

	// Without a hook the port is learned from an earlier fatal broadcast.
	d = New(Options{})
	d.Feed(rec(1, 0, "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010"))
	d.Feed(rec(2, 0, "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=0010(Receiver ID)"))
	d.Feed(rec(3, 0, "nvidia 0000:02:00.0: device has no AER-aware driver"))
	d.Feed(rec(4, 0, "snd_hda_intel 0000:02:00.1: AER: can't recover (no error_detected callback)"))
	if got := d.Flush(); len(got) != 1 || got[0].GPUPCI != "0000:02:00.0" {
		t.Fatalf("fatal: %+v", got)
	}
	got = corrected(d, 10, 10_000)
	if len(got) != 1 || got[0].GPUPCI != "0000:02:00.0" || got[0].Attr(finding.AttrError) != "Replay Timer Timeout" {
		t.Fatalf("learned: %+v", got)
	}

	// A device reporting its own error is the GPU itself.
	d = New(Options{})
	d.Feed(rec(1, 0, "pcieport 0000:00:01.1: AER: Correctable error message received from 0000:01:00.0"))
	d.Feed(rec(2, 0, "nvidia 0000:01:00.0: PCIe Bus Error: severity=Correctable, type=Physical Layer, (Receiver ID)"))
	d.Feed(rec(3, 0, "nvidia 0000:01:00.0:   device [10de:2330] error status/mask=00000001/0000e000"))
	d.Feed(rec(4, 0, "nvidia 0000:01:00.0:    [ 0] RxErr                  (First)"))
	got = d.Flush()
	if len(got) != 1 || got[0].GPUPCI != "0000:01:00.0" || got[0].DevicePCI != "" || got[0].Attr(finding.AttrError) != "RxErr" {
		t.Fatalf("self-reported: %+v", got)
	}
}

// TestNoiseGivesNothing feeds ordinary kernel lines, including NVIDIA lines
// that are not faults (c01's identity lines, c03's nvidia-peermem line).
func TestNoiseGivesNothing(t *testing.T) {
	t.Parallel()
	d := New(Options{})
	var got []finding.Finding
	for i, l := range noiseLines {
		got = append(got, d.Feed(rec(uint64(i+1), int64(i), l))...)
	}
	got = append(got, d.Flush()...)
	if len(got) != 0 {
		t.Errorf("noise gave %d findings: %+v", len(got), got)
	}
}

var noiseLines = []string{
	"nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
	"NVRM: GPU at PCI:0000:02:00: GPU-00000000-0000-0000-0000-000000000001",
	"NVRM: GPU Board Serial Number: 0000000000001",
	"nvidia-nvlink: Nvlink Core is being initialized, major device number 508",
	"nvidia 0000:3b:00.0: enabling device (0000 -> 0003)",
	"pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200",
	"pcieport 0000:00:02.0: PME: Signaling with IRQ 24",
	"pcieport 0000:00:02.0: AER: enabled with IRQ 24",
	"EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
	"IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
	"audit: type=1400 audit(1700000000.000:42): apparmor=\"STATUS\" operation=\"profile_load\"",
	"cali1234: renamed from veth5678",
	"eth0: Link is Up - 100Gbps/Full - flow control off",
	"nvidia-uvm: Loaded the UVM driver, major device number 510.",
	"NVRM: Persistence mode is deprecated and will be removed in a future release.",
	"kauditd_printk_skb: 12 callbacks suppressed",
	"x86/split lock detection: #AC: crashing the kernel on kernel split_locks",
}

func TestAggregate(t *testing.T) {
	t.Parallel()
	mk := func(det, gpu string, xid int, attrs map[string]string, ev string) finding.Finding {
		return finding.Finding{Detector: det, GPUPCI: gpu, Xid: xid, Count: 1, Attrs: attrs, Evidence: []string{ev}}
	}
	in := []finding.Finding{
		mk("xid", "0000:97:00.0", 45, map[string]string{"caused_by": "145", "pid": "1", "secondary": "true"}, "a"),
		mk("xid", "0000:97:00.0", 45, map[string]string{"pid": "2", "secondary": "true"}, "b"), // cut short: inherits 145
		mk("xid", "0000:dc:00.0", 45, map[string]string{"caused_by": "149", "secondary": "true"}, "c"),
		mk("xid", "0000:dc:00.0", 45, map[string]string{"caused_by": "145", "secondary": "true"}, "d"),
		mk("xid", "0000:dc:00.0", 45, map[string]string{"secondary": "true"}, "e"), // two causes known: none inherited
		mk("xid", "0000:01:00.0", 154, map[string]string{"recovery_action": "gpu-reset-required"}, "f"),
		mk("xid", "0000:01:00.0", 154, map[string]string{"recovery_action": "node-reboot-required"}, "g"),
		mk("xid", "0000:01:00.0", 13, map[string]string{"lines": "3"}, "h"),
		mk("xid", "0000:01:00.0", 13, map[string]string{"lines": "2"}, "i"),
	}
	orig := in[1].Attrs["caused_by"]
	got := Aggregate(in)
	if in[1].Attrs["caused_by"] != orig {
		t.Error("Aggregate modified its input")
	}
	type sum struct {
		gpu, causedBy, pid, lines string
		xid, count                int
	}
	var sums []sum
	for _, f := range got {
		sums = append(sums, sum{f.GPUPCI, f.Attrs["caused_by"], f.Attrs["pid"], f.Attrs["lines"], f.Xid, f.Count})
		if f.ID == "" || f.ID != finding.NewID(f) {
			t.Errorf("ID not recomputed: %+v", f)
		}
	}
	want := []sum{
		{"0000:97:00.0", "145", "", "2", 45, 2}, // pids differ: dropped
		{"0000:dc:00.0", "149", "", "", 45, 1},
		{"0000:dc:00.0", "145", "", "", 45, 1},
		{"0000:dc:00.0", "", "", "", 45, 1},
		{"0000:01:00.0", "", "", "", 154, 1},
		{"0000:01:00.0", "", "", "", 154, 1},
		{"0000:01:00.0", "", "", "5", 13, 2},
	}
	if len(sums) != len(want) {
		t.Fatalf("Aggregate = %+v, want %+v", sums, want)
	}
	for i := range want {
		if sums[i] != want[i] {
			t.Errorf("aggregate %d = %+v, want %+v", i, sums[i], want[i])
		}
	}
	if ev := strings.Join(got[0].Evidence, ""); ev != "ab" {
		t.Errorf("evidence %q, want all lines", ev)
	}
}

// TestCaseStreamingEmitsPromptly replays c01's /dev/kmsg file record by
// record: the Xid 79 must come out with its own record.
func TestCaseStreamingEmitsPromptly(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../test/fixtures/cases/c01-xid79-aer-surprise-down/input.devkmsg.txt")
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := kmsg.ParseText(strings.NewReader(string(data)), kmsg.FormatDevKmsg, kmsg.TextOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := New(Options{})
	for _, r := range recs {
		got := d.Feed(r)
		isXid := strings.Contains(r.Message, "Xid")
		hasXid := false
		for _, f := range got {
			hasXid = hasXid || f.Xid == 79
		}
		if isXid != hasXid {
			t.Errorf("record %d %q: findings %q", r.Seq, r.Message, detectors(got))
		}
	}
}

// TestStormIsBounded checks that a storm of lines closer than the group
// window cannot grow one held event, or one aggregate, without bound.
func TestStormIsBounded(t *testing.T) {
	t.Parallel()
	d := New(Options{})
	var events []finding.Finding
	for i := 0; i < 200; i++ {
		events = append(events, d.Feed(rec(uint64(i+1), 0, "NVRM: Xid (PCI:0000:cb:00): 13, pid=7, name=x, Graphics Exception"))...)
	}
	events = append(events, d.Flush()...)
	lines := 0
	for _, f := range events {
		if len(f.Evidence) > MaxEvidence {
			t.Errorf("event with %d evidence lines", len(f.Evidence))
		}
		n, _ := strconv.Atoi(f.Attr(finding.AttrLines))
		lines += n
	}
	if len(events) != 4 || lines != 200 {
		t.Errorf("%d events with %d lines, want 4 with 200", len(events), lines)
	}
	agg := Aggregate(events)
	if len(agg) != 1 || agg[0].Count != 4 || agg[0].Attr(finding.AttrLines) != "200" || len(agg[0].Evidence) != MaxEvidence {
		t.Errorf("aggregate: %d findings, count %d, lines %s, evidence %d", len(agg), agg[0].Count, agg[0].Attr(finding.AttrLines), len(agg[0].Evidence))
	}
}

// TestXFSErrorIsNotShutdown: an XFS metadata CRC report (the verifier's
// lines, the buffer dump and the failed read) says "error"; only XFS's own
// shutdown lines say "shutdown". The controller repairs the node on a
// shutdown of its root volume, never on an error it survived.
func TestXFSErrorIsNotShutdown(t *testing.T) {
	t.Parallel()
	kinds := func(lines []string) map[string]int {
		d := New(Options{})
		var got []finding.Finding
		for i, l := range lines {
			got = append(got, d.Feed(rec(uint64(i+1), int64(i), l))...)
		}
		got = append(got, d.Flush()...)
		out := map[string]int{}
		for _, f := range got {
			if f.Detector != finding.DetectorFilesystemError {
				t.Errorf("unexpected finding %s %v", f.Detector, f.Attrs)
				continue
			}
			out[f.Attr(finding.AttrKind)] += f.Count
		}
		return out
	}
	crc := []string{
		"XFS (nvme0n1p1): Metadata CRC error detected at xfs_dir3_block_read_verify+0x9e/0xc0 [xfs], xfs_dir3_block block 0x1e3c80",
		"XFS (nvme0n1p1): Unmount and run xfs_repair",
		"XFS (nvme0n1p1): First 128 bytes of corrupted metadata buffer:",
		"00000000: 58 44 42 33 00 00 00 00 00 00 00 00 00 1e 3c 80  XDB3..........<.",
		`XFS (nvme0n1p1): metadata I/O error in "xfs_da_read_buf+0xd9/0x130 [xfs]" at daddr 0x1e3c80 len 8 error 74`,
	}
	if got := kinds(crc); got["shutdown"] != 0 || got["error"] == 0 {
		t.Errorf("CRC error report: kinds %v, want errors only", got)
	}
	shutdown := append(append([]string(nil), crc...),
		"XFS (nvme0n1p1): Corruption of in-memory data (0x8) detected at xfs_trans_cancel+0x1a1/0x1e0 [xfs] (fs/xfs/xfs_trans.c:1104).  Shutting down filesystem.",
		"XFS (nvme0n1p1): Please unmount the filesystem and rectify the problem(s)")
	if got := kinds(shutdown); got["shutdown"] != 1 {
		t.Errorf("shutdown report: kinds %v, want one shutdown", got)
	}
}

// TestRCUStallNamesItsCPUs: the CPU lines of an RCU stall warning, with the
// "rcu: " prefix of 5.x kernels and without it (4.x), give the stalled CPUs,
// so the controller can tie the stall to a lockup of the same CPU.
func TestRCUStallNamesItsCPUs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		lines []string
		cpus  string
	}{
		{"self-detected, 5.x", []string{
			"rcu: INFO: rcu_sched self-detected stall on CPU",
			"rcu: \t37-....: (59997 ticks this GP) idle=2d6/1/0x4000000000000000 softirq=1183922/1183922 fqs=14921",
		}, "37"},
		{"detected stalls on two CPUs, 5.x", []string{
			"rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
			"rcu: \t12-...0: (1 GPs behind) idle=b3e/1/0x4000000000000000 softirq=52/53 fqs=2625",
			"rcu: \t37-...0: (0 ticks this GP) idle=c1a/1/0x4000000000000000 softirq=71/71 fqs=2625",
			"\t(detected by 3, t=5252 jiffies, g=981, q=77)",
		}, "12,37"},
		{"4.x without the prefix", []string{
			"INFO: rcu_sched self-detected stall on CPU",
			"\t5-...: (20999 ticks this GP) idle=c5b/140000000000001/0 softirq=9/9 fqs=5246",
		}, "5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := New(Options{})
			var got []finding.Finding
			for i, l := range tt.lines {
				got = append(got, d.Feed(rec(uint64(i+1), int64(i), l))...)
			}
			got = append(got, d.Flush()...)
			if len(got) != 1 || got[0].Detector != finding.DetectorRCUStall {
				t.Fatalf("findings = %+v, want one rcu-stall", got)
			}
			if c := got[0].Attr(finding.AttrCPU); c != tt.cpus {
				t.Errorf("cpu = %q, want %q", c, tt.cpus)
			}
		})
	}
}
