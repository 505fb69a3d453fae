package kmsg

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeFile replays a script of read results.
type fakeFile struct {
	mu     sync.Mutex
	reads  []fakeRead
	seeks  []int
	closed bool
}

type fakeRead struct {
	data string
	err  error
}

func (f *fakeFile) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, os.ErrClosed
	}
	if len(f.reads) == 0 {
		return 0, io.EOF
	}
	r := f.reads[0]
	f.reads = f.reads[1:]
	if r.err != nil {
		return 0, r.err
	}
	return copy(p, r.data), nil
}

func (f *fakeFile) Seek(_ int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seeks = append(f.seeks, whence)
	return 0, nil
}

func (f *fakeFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// runAll runs r until it returns and collects what it delivered.
func runAll(t *testing.T, r *Reader) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make(chan Record)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx, out); close(out) }()
	var recs []Record
	for rec := range out {
		recs = append(recs, rec)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	return recs
}

func TestReaderOverrunCountsLostRecordsAndKeepsReading(t *testing.T) {
	t.Parallel()
	ff := &fakeFile{reads: []fakeRead{
		{data: "3,10,100,-;first\n"},
		{data: "3,11,200,-;second\n SUBSYSTEM=pci\n DEVICE=+pci:0000:00:02.0\n"},
		{err: &os.PathError{Op: "read", Path: "/dev/kmsg", Err: syscall.EPIPE}},
		{data: "3,20,300,-;after the gap\n"},            // 12..19 were overwritten: 8 lost
		{data: "11,21,400,-;written from user space\n"}, // user facility: filtered
		{data: "not a record\n"},                        // kept, marked unparsed
		{data: "0,22,500,-;kernel emerg\n"},
	}}
	opens := 0
	r, err := Open(ReaderOptions{SeekEnd: true, open: func(string) (file, error) { opens++; return ff, nil }})
	if err != nil {
		t.Fatal(err)
	}
	recs := runAll(t, r)
	var msgs []string
	for _, rec := range recs {
		msgs = append(msgs, rec.Message)
	}
	if got, want := strings.Join(msgs, "|"), "first|second|after the gap|not a record|kernel emerg"; got != want {
		t.Errorf("delivered %q, want %q", got, want)
	}
	if !recs[3].Unparsed || recs[0].Unparsed {
		t.Errorf("Unparsed flags wrong: %+v", recs)
	}
	want := ReaderStats{Read: 6, Delivered: 5, Filtered: 1, Unparsed: 1, Lost: 8, Overruns: 1, LastSeq: 22}
	if got := r.Stats(); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
	if r.Lost() != 8 {
		t.Errorf("Lost() = %d, want 8", r.Lost())
	}
	if opens != 1 {
		t.Errorf("device opened %d times, want 1 (never reopen after EPIPE)", opens)
	}
	if len(ff.seeks) != 1 || ff.seeks[0] != io.SeekEnd {
		t.Errorf("seeks = %v, want one SEEK_END", ff.seeks)
	}
	if !ff.closed {
		t.Error("device not closed after Run")
	}
}

func TestReaderAcceptUserFacilityAndPartialLines(t *testing.T) {
	t.Parallel()
	ff := &fakeFile{reads: []fakeRead{
		{data: "11,1,10,-;user "}, // a FIFO or file may cut a line
		{data: "record\n3,2,20,-;kernel\n3,3,"},
		{data: "30,-;last"},
	}}
	r, err := Open(ReaderOptions{AcceptUserFacility: true, open: func(string) (file, error) { return ff, nil }})
	if err != nil {
		t.Fatal(err)
	}
	recs := runAll(t, r)
	if len(recs) != 3 || recs[0].Message != "user record" || recs[0].Facility != FacilityUser ||
		recs[1].Message != "kernel" || recs[2].Message != "last" || recs[2].Usec != 30 {
		t.Errorf("records = %+v", recs)
	}
	if len(ff.seeks) != 0 {
		t.Errorf("seeked %v without SeekEnd", ff.seeks)
	}
}

func TestReaderReadErrorIsReturned(t *testing.T) {
	t.Parallel()
	ff := &fakeFile{reads: []fakeRead{{err: syscall.EIO}}}
	r, _ := Open(ReaderOptions{open: func(string) (file, error) { return ff, nil }})
	err := r.Run(context.Background(), make(chan Record, 1))
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("Run error = %v, want EIO", err)
	}
}

func TestReaderRegularFile(t *testing.T) {
	t.Parallel()
	src := filepath.Join("../../test/fixtures/cases/c01-xid79-aer-surprise-down/input.devkmsg.txt")
	r, err := Open(ReaderOptions{Path: src})
	if err != nil {
		t.Fatal(err)
	}
	recs := runAll(t, r)
	if len(recs) != 13 || recs[12].Seq != 1055 || r.Stats().Lost != 0 {
		t.Errorf("got %d records (last %+v), stats %+v", len(recs), recs[len(recs)-1], r.Stats())
	}
	if recs[0].Time.IsZero() {
		t.Error("Time not derived from boot time")
	}
}

func TestOpenMissingDevice(t *testing.T) {
	t.Parallel()
	_, err := Open(ReaderOptions{Path: filepath.Join(t.TempDir(), "kmsg")})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open error = %v, want ErrNotExist", err)
	}
}

// openRealDevKmsg opens the machine's /dev/kmsg for writing, or skips.
func openRealDevKmsg(t *testing.T) *os.File {
	t.Helper()
	w, err := os.OpenFile(DevKmsgPath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("%s is not writable here (needs root on Linux): %v (make test reads and writes the real kernel log: run it as root on Linux, as .ci/run does)", DevKmsgPath, err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// TestReaderRealDevKmsg injects a uniquely tagged Xid line into the real
// kernel ring buffer and reads it back through Reader: once with
// AcceptUserFacility (it arrives, with its user facility) and once with the
// default filter (it is read and filtered, never delivered).
func TestReaderRealDevKmsg(t *testing.T) {
	t.Parallel()
	w := openRealDevKmsg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	accepting, err := Open(ReaderOptions{SeekEnd: true, AcceptUserFacility: true})
	if err != nil {
		t.Fatalf("%s is not readable: %v (make test reads and writes the real kernel log: run it as root on Linux, as .ci/run does)", DevKmsgPath, err)
	}
	strict, err := Open(ReaderOptions{SeekEnd: true})
	if err != nil {
		t.Fatal(err)
	}
	acceptCh, strictCh := make(chan Record, 64), make(chan Record, 64)
	var wg sync.WaitGroup
	for _, rc := range []struct {
		r  *Reader
		ch chan Record
	}{{accepting, acceptCh}, {strict, strictCh}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rc.r.Run(ctx, rc.ch); err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
	}

	var nonce [4]byte
	rand.Read(nonce[:])
	bus, dev := 0xe0|nonce[0]&0x1f, nonce[1]&0x1f
	tag := fmt.Sprintf("frtest%x", nonce[2:])
	line := fmt.Sprintf("<3>NVRM: Xid (PCI:0000:%02x:%02x): 79, pid=1, name=%s, GPU has fallen off the bus.", bus, dev, tag)
	before := time.Now()
	// Like echo, end the line with a newline: the kernel keeps a record
	// without one open for continuation, invisible to readers, until the
	// next record arrives.
	if _, err := w.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("write %s: %v", DevKmsgPath, err)
	}

	var got Record
	for got.Seq == 0 {
		select {
		case rec := <-acceptCh:
			if strings.Contains(rec.Message, tag) {
				got = rec
			}
		case <-ctx.Done():
			t.Fatalf("injected record %q not read back", line)
		}
	}
	if got.Facility != FacilityUser || got.Prio != 3 || got.Message != strings.TrimPrefix(line, "<3>") {
		t.Errorf("read back %+v", got)
	}
	if d := got.Time.Sub(before); d < -time.Minute || d > time.Minute {
		t.Errorf("record time %v is %v away from the write", got.Time, d)
	}

	// The strict reader reads past the record but never delivers it.
	for strict.Stats().LastSeq < got.Seq {
		select {
		case <-ctx.Done():
			t.Fatalf("strict reader did not reach seq %d (stats %+v)", got.Seq, strict.Stats())
		case rec := <-strictCh:
			if strings.Contains(rec.Message, tag) {
				t.Errorf("default reader delivered a user-facility record: %+v", rec)
			}
		case <-time.After(10 * time.Millisecond):
		}
	}
	if strict.Stats().Filtered == 0 {
		t.Errorf("strict reader filtered nothing: %+v", strict.Stats())
	}
	cancel()
	wg.Wait()
	for rec := range drain(strictCh) {
		if strings.Contains(rec.Message, tag) {
			t.Errorf("default reader delivered a user-facility record: %+v", rec)
		}
	}
}

func drain(ch chan Record) chan Record {
	out := make(chan Record, len(ch))
	for len(ch) > 0 {
		out <- <-ch
	}
	close(out)
	return out
}

// TestReaderRealDevKmsgCancel checks that cancelling ctx unblocks a read
// that waits for new records.
func TestReaderRealDevKmsgCancel(t *testing.T) {
	t.Parallel()
	r, err := Open(ReaderOptions{SeekEnd: true})
	if err != nil {
		t.Fatalf("%s is not readable here: %v (make test reads and writes the real kernel log: run it as root on Linux, as .ci/run does)", DevKmsgPath, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, make(chan Record, 1024)) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after ctx was cancelled")
	}
}

// TestReaderRealDevKmsgCoalesce reads a burst of injected records with
// Coalesce: every record arrives, none twice, and cancelling ctx ends a
// reader that waits for the next record.
func TestReaderRealDevKmsgCoalesce(t *testing.T) {
	t.Parallel()
	w := openRealDevKmsg(t)
	r, err := Open(ReaderOptions{SeekEnd: true, AcceptUserFacility: true, Coalesce: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("%s is not readable: %v (make test reads and writes the real kernel log: run it as root on Linux, as .ci/run does)", DevKmsgPath, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch := make(chan Record, 256)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, ch) }()
	var nonce [4]byte
	rand.Read(nonce[:])
	tag := fmt.Sprintf("frcoalesce%x", nonce)
	const n = 10 // the per-open rate limit's burst
	for i := range n {
		if _, err := fmt.Fprintf(w, "<6>%s %d\n", tag, i); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case rec := <-ch:
			if strings.HasPrefix(rec.Message, tag) {
				if seen[rec.Message] {
					t.Errorf("record %q delivered twice", rec.Message)
				}
				seen[rec.Message] = true
			}
		case <-ctx.Done():
			t.Fatalf("read back %d of %d records", len(seen), n)
		}
	}
	time.Sleep(50 * time.Millisecond) // the reader now waits for the next record
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
