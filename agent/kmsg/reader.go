package kmsg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DevKmsgPath is the kernel's log device.
const DevKmsgPath = "/dev/kmsg"

// readBufSize is the read(2) buffer. The kernel returns exactly one record per
// read and fails with EINVAL when the buffer is smaller than the record; a
// record (header, message and key/value lines) is at most
// CONSOLE_EXT_LOG_MAX = 8 KiB.
const readBufSize = 8192 * 2

// ReaderOptions configure a Reader. The zero value reads /dev/kmsg from the
// oldest record the kernel still holds and accepts kernel-facility records
// only.
type ReaderOptions struct {
	// Path of the device; default DevKmsgPath. Tests may point it at a FIFO
	// or a regular file holding records in the /dev/kmsg format.
	Path string
	// SeekEnd starts at the end of the ring buffer (SEEK_END), so only
	// records printed after Open are read. Without it the reader starts at
	// the oldest record still held, which catches faults from before the
	// agent started.
	SeekEnd bool
	// AcceptUserFacility also delivers records of the user facility (1),
	// i.e. lines written to /dev/kmsg from user space. Only for tests that
	// inject records themselves: in production a root process must not be
	// able to fake an Xid, so only kernel-facility (0) records count.
	// A test writing to /dev/kmsg must end each line with "\n" (as echo
	// does): the kernel keeps a record without one open for continuation,
	// invisible to readers, until the next record arrives.
	AcceptUserFacility bool
	// Coalesce, when positive, makes a reader that has caught up with the
	// kernel wait this long before it waits for the next record. The kernel
	// wakes a waiting reader for every record written, so under a flood a
	// reader that keeps up would wake once per record; with Coalesce it
	// wakes about once per Coalesce and reads the whole backlog. It delays a
	// record by at most Coalesce; keep it far below the ring buffer's slack
	// (128 KiB is about 0.25 s at 5,000 lines/s). Ignored for inputs that
	// cannot be polled (regular files).
	Coalesce time.Duration

	// ResumeAfter, when non-zero, skips records whose sequence number is
	// at most it: a reader reopened after a failure (Device) does not
	// deliver again what the one before it delivered. Records lost in
	// between still count in Lost.
	ResumeAfter uint64

	// open replaces os.OpenFile in tests.
	open func(path string) (file, error)
}

// file is what Reader needs of the opened device.
type file interface {
	io.ReadCloser
	Seek(offset int64, whence int) (int64, error)
}

// ReaderStats are a Reader's counters since Open. Lost and Overruns must be
// surfaced (metric and monitor state): silence after a loss must never look
// like health.
type ReaderStats struct {
	Read      uint64 // records read from the device, every facility
	Delivered uint64 // records sent to the output channel
	Filtered  uint64 // records dropped because of their facility
	Unparsed  uint64 // reads that were not a /dev/kmsg record; delivered with Record.Unparsed set
	Lost      uint64 // records overwritten in the ring before they were read (sequence number gaps)
	Overruns  uint64 // EPIPE results: times the reader fell behind the ring buffer
	LastSeq   uint64 // sequence number of the last record read
}

// Reader reads records from /dev/kmsg, one record per read(2), into a buffer
// it reuses. When it falls behind the kernel's ring buffer the kernel answers
// one read with EPIPE and the next one continues at the oldest record still
// held; the Reader counts the records lost from the sequence-number gap and
// keeps reading. It never reopens the device, since reopening at the end would
// throw away the backlog it can still read.
//
// Use Open, then Run once. Stats may be called concurrently with Run.
type Reader struct {
	path       string
	f          file
	acceptUser bool
	coalesce   time.Duration
	bootWall   time.Time
	buf        []byte

	read, delivered, filtered, unparsed, lost, overruns, lastSeq atomic.Uint64
	haveSeq                                                      bool
	resumeAfter                                                  uint64
}

// Open opens the device (and seeks to its end with SeekEnd), so that errors
// such as a missing device or permissions show at start-up.
func Open(opts ReaderOptions) (*Reader, error) {
	path := opts.Path
	if path == "" {
		path = DevKmsgPath
	}
	open := opts.open
	if open == nil {
		open = func(p string) (file, error) { return os.OpenFile(p, os.O_RDONLY, 0) }
	}
	f, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("open kernel log: %w", err)
	}
	if opts.SeekEnd {
		if _, err := f.Seek(0, io.SeekEnd); err != nil {
			f.Close()
			return nil, fmt.Errorf("seek to end of %s: %w", path, err)
		}
	}
	return &Reader{
		path:        path,
		f:           f,
		acceptUser:  opts.AcceptUserFacility,
		coalesce:    opts.Coalesce,
		bootWall:    bootWallTime(),
		buf:         make([]byte, readBufSize),
		resumeAfter: opts.ResumeAfter,
	}, nil
}

// bootWallTime returns the wall-clock time of boot as the kernel's log
// timestamps count it: now minus CLOCK_MONOTONIC, as journald does for
// /dev/kmsg records. Zero when the clock cannot be read.
func bootWallTime() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Time{}
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}

// Close closes the device. Run closes it too when it returns.
func (r *Reader) Close() error { return r.f.Close() }

// Stats returns the counters so far.
func (r *Reader) Stats() ReaderStats {
	return ReaderStats{
		Read:      r.read.Load(),
		Delivered: r.delivered.Load(),
		Filtered:  r.filtered.Load(),
		Unparsed:  r.unparsed.Load(),
		Lost:      r.lost.Load(),
		Overruns:  r.overruns.Load(),
		LastSeq:   r.lastSeq.Load(),
	}
}

// Lost returns the number of records lost so far (ReaderStats.Lost), for
// the heartbeat's LostRecords.
func (r *Reader) Lost() uint64 { return r.lost.Load() }

// Run reads records and sends the accepted ones to out until ctx is done
// (it then closes the device, which unblocks a pending read, and returns nil),
// the input ends (a regular file: nil) or reading fails (the error). Records
// get Time = boot time + Usec. Run never blocks on out without also watching
// ctx. Call it once; the device is closed when it returns.
func (r *Reader) Run(ctx context.Context, out chan<- Record) error {
	stop := context.AfterFunc(ctx, func() { r.f.Close() })
	defer stop()
	defer r.f.Close()

	held := 0 // bytes of an incomplete line kept at the start of buf (regular files, FIFOs)
	// With Coalesce, reads go through the raw descriptor: after a record
	// arrived the reader drains without waiting (EAGAIN when caught up),
	// pauses Coalesce, then waits for the next record.
	read := r.f.Read
	var raw syscall.RawConn
	if sc, ok := r.f.(syscall.Conn); ok && r.coalesce > 0 {
		if rc, err := sc.SyscallConn(); err == nil {
			raw = rc
		}
	}
	wait := true
	if raw != nil {
		read = func(b []byte) (int, error) {
			var n int
			var rerr error
			err := raw.Read(func(fd uintptr) bool {
				n, rerr = rawRead(fd, b)
				if errors.Is(rerr, unix.EINTR) {
					return false
				}
				return !(wait && errors.Is(rerr, unix.EAGAIN)) // false: the poller waits for the next record
			})
			if err != nil {
				return 0, err
			}
			if rerr == nil && n == 0 {
				return 0, io.EOF
			}
			return max(n, 0), rerr
		}
	}
	for {
		n, err := read(r.buf[held:])
		if ctx.Err() != nil {
			return nil
		}
		if raw != nil {
			if errors.Is(err, unix.EAGAIN) { // caught up: pause, then wait
				t := time.NewTimer(r.coalesce)
				select {
				case <-ctx.Done():
					t.Stop()
					return nil
				case <-t.C:
				}
				wait = true
				continue
			}
			wait = false
		}
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, syscall.EPIPE) {
				// Fell behind: the next read continues at the oldest record
				// still held; the gap in Seq tells how many were lost.
				r.overruns.Add(1)
				continue
			}
			return fmt.Errorf("read %s: %w", r.path, err)
		}
		data := r.buf[:held+n]
		held = 0
		// /dev/kmsg returns one record ending in '\n', possibly followed by
		// " KEY=value" lines. Other inputs may return several lines or part
		// of one; an incomplete last line waits for the next read.
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				if err == nil && len(data) < len(r.buf) {
					held = copy(r.buf, data)
					break
				}
				i = len(data)
			}
			line := data[:i]
			data = data[min(i+1, len(data)):]
			if len(line) == 0 || line[0] == ' ' {
				continue // key/value continuation of the record before
			}
			if !r.deliver(ctx, out, string(line)) {
				return nil
			}
		}
		if errors.Is(err, io.EOF) || (n == 0 && err == nil) {
			return nil
		}
	}
}

// rawRead reads from a non-blocking descriptor without entering the
// scheduler's syscall state: the read never blocks (EAGAIN instead), and
// skipping entersyscall spares the runtime from handing the P to another
// thread on every record, which under a flood was most of the agent's
// context switches.
func rawRead(fd uintptr, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if errno != 0 {
		return -1, errno
	}
	return int(n), nil
}

// deliver parses one record line, counts it and sends it if its facility is
// accepted. It returns false when ctx ended while sending.
func (r *Reader) deliver(ctx context.Context, out chan<- Record, line string) bool {
	r.read.Add(1)
	rec, err := ParseDevKmsg(line)
	if err != nil {
		// Not expected from the kernel; keep the text rather than lose it.
		r.unparsed.Add(1)
		rec = Record{Prio: PrioUnknown, Facility: FacilityUnknown, Usec: -1, Message: line, Raw: line, Unparsed: true}
	} else {
		if r.resumeAfter > 0 && rec.Seq <= r.resumeAfter {
			return true // delivered by the reader before this one
		}
		last := r.lastSeq.Load()
		if !r.haveSeq && r.resumeAfter > 0 {
			last, r.haveSeq = r.resumeAfter, true
		}
		if r.haveSeq && rec.Seq > last+1 {
			r.lost.Add(rec.Seq - last - 1)
		}
		r.lastSeq.Store(rec.Seq)
		r.haveSeq = true
		if !r.bootWall.IsZero() {
			rec.Time = r.bootWall.Add(time.Duration(rec.Usec) * time.Microsecond)
		}
		if !(rec.Facility == FacilityKernel || rec.Facility == FacilityUser && r.acceptUser) {
			r.filtered.Add(1)
			return true
		}
	}
	select {
	case out <- rec:
		r.delivered.Add(1)
		return true
	case <-ctx.Done():
		return false
	}
}

// Device is the kernel log device as a source that can be opened again
// after a failure: Open opens a fresh Reader (resuming after the last
// record the one before delivered), Run reads with it until ctx ends or
// reading fails, and Lost sums the records lost over every Reader. The
// agent pipeline (agent/pipeline) opens it, and when Open or Run fails it
// reports the kernel log unknown and opens it again with backoff, so a
// device the container may not open never stops the other monitors.
// Open, Run and Close are called from one goroutine; Lost from any.
type Device struct {
	Options ReaderOptions

	mu         sync.Mutex
	r          *Reader
	lostBefore uint64 // records lost by closed Readers
	lastSeq    uint64 // last sequence number a closed Reader read
}

// Open opens the device. Errors: those of Open (missing device, EPERM).
func (d *Device) Open() error {
	d.mu.Lock()
	if d.r != nil {
		d.retire()
	}
	opts := d.Options
	if d.lastSeq > 0 {
		opts.ResumeAfter, opts.SeekEnd = d.lastSeq, false
	}
	d.mu.Unlock()
	r, err := Open(opts)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.r = r
	d.mu.Unlock()
	return nil
}

// retire closes the current Reader and keeps its counters; d.mu is held.
func (d *Device) retire() {
	d.r.Close()
	d.lostBefore += d.r.Lost()
	if st := d.r.Stats(); st.LastSeq > d.lastSeq {
		d.lastSeq = st.LastSeq
	}
	d.r = nil
}

// Run reads records into out (Reader.Run), opening the device first when
// Open was not called. The Reader is closed when Run returns.
func (d *Device) Run(ctx context.Context, out chan<- Record) error {
	d.mu.Lock()
	r := d.r
	d.mu.Unlock()
	if r == nil {
		if err := d.Open(); err != nil {
			return err
		}
		d.mu.Lock()
		r = d.r
		d.mu.Unlock()
	}
	err := r.Run(ctx, out)
	d.mu.Lock()
	if d.r == r {
		d.retire()
	}
	d.mu.Unlock()
	return err
}

// Lost returns the records lost so far, over every Reader opened.
func (d *Device) Lost() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.lostBefore
	if d.r != nil {
		n += d.r.Lost()
	}
	return n
}

// Close closes the open Reader, if any.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.r != nil {
		d.retire()
	}
	return nil
}
