package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// pciSeq makes every injected PCI address unique across tests of one run;
// the process id separates concurrent runs.
var pciSeq atomic.Uint32

func uniquePCI() string {
	n := pciSeq.Add(1)
	return fmt.Sprintf("%04x:%02x:%02x", 0x1000+os.Getpid()%0xe000, 0x80+n%0x70, (n/0x70)%0x20)
}

// injectKmsg writes one record to the real /dev/kmsg (as root). It skips
// the test where /dev/kmsg is not writable.
func injectKmsg(t testing.TB, line string) {
	t.Helper()
	f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("/dev/kmsg not writable here (%v): the real kernel-log path needs root (make test reads and writes the real kernel log: run it as root on Linux, as .ci/run does)", err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Fatalf("write /dev/kmsg: %v", err)
	}
}

func kmsgReadable(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile("/dev/kmsg", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("/dev/kmsg not readable and writable here (%v): the real kernel-log path needs root (make test reads and writes the real kernel log: run it as root on Linux, as .ci/run does)", err)
	}
	f.Close()
}

// waitRepairRow polls PostgreSQL until the node has a repair row and returns
// when it appeared.
func waitRepairRow(ctx context.Context, st *store.Store, node string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, err := st.OpenRepairForNode(ctx, cluster, node); err == nil {
			return time.Now(), nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return time.Time{}, err
		}
		time.Sleep(time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("no repair row for %s after %s", node, timeout)
}

// startKmsgAgent starts an agent on the real /dev/kmsg, from its end, and
// waits until it reports (a heartbeat), so a line written afterwards is read.
func startKmsgAgent(t testing.TB, f *fleet, node string) {
	t.Helper()
	startAgent(t, f.ctrl.URL, node, "--kmsg", "/dev/kmsg", "--kmsg-seek-end", "--accept-user-facility")
	eventually(t, 20*time.Second, "agent "+node+" heartbeat", func() (bool, string) {
		n, err := f.ctrl.Store.GetNode(context.Background(), cluster, node)
		return err == nil && !n.LastSeen.IsZero(), fmt.Sprint(err)
	})
}

// TestKernelLogToRepairRow: an Xid 79 record written to the real /dev/kmsg
// is read by the real agent and becomes a repair row in PostgreSQL.
func TestKernelLogToRepairRow(t *testing.T) {
	kmsgReadable(t)
	f := startFleet(t, time.Hour, "e2e-kmsg")
	startKmsgAgent(t, f, "e2e-kmsg")
	pci := uniquePCI()
	injectKmsg(t, fmt.Sprintf("<3>NVRM: Xid (PCI:%s): 79, pid=1, name=e2e, GPU has fallen off the bus.", pci))
	if _, err := waitRepairRow(context.Background(), f.ctrl.Store, "e2e-kmsg", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	r, err := f.ctrl.Store.OpenRepairForNode(context.Background(), cluster, "e2e-kmsg")
	if err != nil || r.Reason != "GPULost" {
		t.Fatalf("repair = %+v, %v; want GPULost", r, err)
	}
}

// BenchmarkXidToRepairRow measures the time from an Xid line being written
// to /dev/kmsg to the repair row existing in PostgreSQL: agent read, detect,
// critical flush, HTTP ingest, store, reconcile, ledger insert. Each
// iteration uses its own node and agent (started before the clock runs).
// Reported: median and p90 in milliseconds.
//
//	go test ./test/e2e -run '^$' -bench XidToRepairRow -benchtime 20x
func BenchmarkXidToRepairRow(b *testing.B) {
	kmsgReadable(b)
	nodes := make([]string, b.N)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("lat-%d", i)
	}
	f := startFleet(b, time.Hour, nodes...)
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		startKmsgAgent(b, f, nodes[i])
		line := fmt.Sprintf("<3>NVRM: Xid (PCI:%s): 79, pid=1, name=bench, GPU has fallen off the bus.", uniquePCI())
		b.StartTimer()
		t0 := time.Now()
		injectKmsg(b, line)
		t1, err := waitRepairRow(context.Background(), f.ctrl.Store, nodes[i], 20*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, t1.Sub(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ms-median")
	b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds())/1000, "ms-p90")
}
