package detect_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// TestLiveDevKmsgXid79 is the agent's kernel path end to end on the real
// /dev/kmsg: a uniquely addressed Xid 79 line is injected into the kernel
// ring buffer, read back by kmsg.Reader (accepting the user facility, as only
// tests do) and turned into an Xid 79 finding by the Feed call of its record.
func TestLiveDevKmsgXid79(t *testing.T) {
	t.Parallel()
	w, err := os.OpenFile(kmsg.DevKmsgPath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("%s is not writable here (needs root on Linux): %v (make test reads and writes the real kernel log: run it as root on Linux, as .ci/run does)", kmsg.DevKmsgPath, err)
	}
	defer w.Close()
	r, err := kmsg.Open(kmsg.ReaderOptions{SeekEnd: true, AcceptUserFacility: true})
	if err != nil {
		t.Fatalf("%s is not readable: %v (make test reads and writes the real kernel log: run it as root on Linux, as .ci/run does)", kmsg.DevKmsgPath, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs := make(chan kmsg.Record, 64)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, recs) }()

	var nonce [3]byte
	rand.Read(nonce[:])
	bus, dev := 0xc0|nonce[0]&0x3f, nonce[1]&0x1f
	gpu := fmt.Sprintf("0000:%02x:%02x.0", bus, dev)
	tag := fmt.Sprintf("frlive%02x", nonce[2])
	line := fmt.Sprintf("<3>NVRM: Xid (PCI:0000:%02x:%02x): 79, pid=1, name=%s, GPU has fallen off the bus.\n", bus, dev, tag)
	if _, err := w.Write([]byte(line)); err != nil {
		t.Fatalf("write %s: %v", kmsg.DevKmsgPath, err)
	}

	d := detect.New(detect.Options{Node: "node-a1", BootID: "boot"})
	for {
		select {
		case rec := <-recs:
			for _, f := range d.Feed(rec) {
				if f.GPUPCI != gpu {
					continue // another test's or the kernel's record
				}
				if f.Detector != finding.DetectorXid || f.Xid != 79 || f.Attr(finding.AttrProcess) != tag ||
					f.Seq != rec.Seq || f.Time.IsZero() || !strings.Contains(f.Evidence[0], tag) {
					t.Errorf("finding %+v", f)
				}
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
				return
			}
		case <-ctx.Done():
			t.Fatalf("no Xid 79 finding for %s (reader stats %+v)", gpu, r.Stats())
		}
	}
}
