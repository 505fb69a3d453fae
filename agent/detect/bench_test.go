package detect_test

import (
	"fmt"
	"testing"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// benchRecords is a realistic mix of /dev/kmsg records on a GPU node: mostly
// noise (network, containers, audit, NVIDIA informational lines), one AER
// port line that is not an error, and about 1 in 200 an Xid.
func benchRecords() []kmsg.Record {
	noise := []string{
		"IPv6: ADDRCONF(NETDEV_CHANGE): cali%d: link becomes ready",
		"cali%d: renamed from veth5678",
		"audit: type=1400 audit(1700000000.000:%d): apparmor=\"STATUS\" operation=\"profile_load\"",
		"eth0: Link is Up - 100Gbps/Full - flow control off %d",
		"EXT4-fs (nvme0n1p%d): mounted filesystem with ordered data mode. Quota mode: none.",
		"NVRM: GPU at PCI:0000:%02x:00: GPU-00000000-0000-0000-0000-000000000001",
		"nvidia 0000:%02x:00.0: enabling device (0000 -> 0003)",
		"pcieport 0000:00:%02x.0: AER: enabled with IRQ 24",
		"kauditd_printk_skb: %d callbacks suppressed",
		"overlayfs: idmapped layers are currently not supported %d",
	}
	xids := []string{
		"NVRM: Xid (PCI:0000:%02x:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
		"NVRM: Xid (PCI:0000:%02x:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
		"NVRM: Xid (PCI:0000:%02x:00): 79, pid=1, name=x, GPU has fallen off the bus.",
	}
	var recs []kmsg.Record
	for i := 0; i < 10000; i++ {
		var msg string
		if i%200 == 199 {
			msg = fmt.Sprintf(xids[i/200%len(xids)], i%256)
		} else {
			msg = fmt.Sprintf(noise[i%len(noise)], i%100)
		}
		raw := fmt.Sprintf("6,%d,%d,-;%s", i+1, int64(i)*200, msg)
		recs = append(recs, kmsg.Record{Seq: uint64(i + 1), Prio: 6, Usec: int64(i) * 200, Message: msg, Raw: raw})
	}
	return recs
}

// BenchmarkDetectorFeed measures Detector.Feed per record on the mix above;
// lines/s is the throughput one core sustains.
func BenchmarkDetectorFeed(b *testing.B) {
	recs := benchRecords()
	d := detect.New(detect.Options{Node: "node-a1", BootID: "boot"})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d.Feed(recs[i%len(recs)])
	}
	b.StopTimer()
	d.Flush()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkDetectorFeedNoise is the common case: a line no detector wants.
func BenchmarkDetectorFeedNoise(b *testing.B) {
	rec := kmsg.Record{Seq: 1, Prio: 6, Usec: 1, Message: "IPv6: ADDRCONF(NETDEV_CHANGE): cali1234: link becomes ready"}
	d := detect.New(detect.Options{})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		rec.Seq++
		d.Feed(rec)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkParseDevKmsg measures the /dev/kmsg record parser.
func BenchmarkParseDevKmsg(b *testing.B) {
	line := "6,1051,74889542234,-;pcieport 0000:00:02.0: broadcast error_detected message"
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := kmsg.ParseDevKmsg(line); err != nil {
			b.Fatal(err)
		}
	}
}
