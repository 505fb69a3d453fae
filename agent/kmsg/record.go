// Package kmsg reads the Linux kernel log: live from /dev/kmsg (Reader) and
// from saved text renderings of it (ParseText: dmesg, dmesg --ctime, dmesg -H,
// syslog, journalctl -k and the /dev/kmsg record format itself).
//
// It yields Records only and makes no judgement about them; turning records
// into findings is agent/detect's job. Everything here follows the kernel's
// documentation of the /dev/kmsg interface
// (Documentation/ABI/testing/dev-kmsg) and the output formats of util-linux
// dmesg, rsyslog and journalctl.
package kmsg

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Facilities of a /dev/kmsg record (the syslog facility, prio>>3).
const (
	// FacilityUnknown marks a record whose text format carries no facility
	// (dmesg renderings) or that could not be parsed.
	FacilityUnknown = -1
	// FacilityKernel is the facility of records printed by the kernel itself
	// (printk). Only these count as evidence in production: NVIDIA driver
	// lines always carry it.
	FacilityKernel = 0
	// FacilityUser is the facility of records written to /dev/kmsg from user
	// space (any root process can write them, so they must not count as
	// evidence unless a test injected them on purpose).
	FacilityUser = 1
)

// PrioUnknown is Record.Prio when the text format carries no priority.
const PrioUnknown = -1

// Record is one kernel log message.
type Record struct {
	// Seq is the kernel's 64-bit sequence number (/dev/kmsg only); 0 when the
	// format does not carry one. Consecutive records differ by 1; a larger
	// step means records were lost.
	Seq uint64
	// Prio is the log level (severity) 0..7 (0 emerg .. 3 err .. 4 warning ..
	// 6 info .. 7 debug), or PrioUnknown. Drivers are not consistent about
	// levels, so nothing should select records by Prio alone.
	Prio int
	// Facility is the syslog facility (Facility* constants).
	Facility int
	// Usec is the monotonic kernel timestamp in microseconds since boot
	// (the "[74785.660366]" of dmesg), or -1 when the format has none.
	Usec int64
	// Time is the absolute wall-clock time of the record when the source has
	// it (dmesg --ctime, syslog, journalctl, or computed from boot time by the
	// live Reader); the zero Time when unknown (dmesg, dmesg -H deltas, a
	// /dev/kmsg text file).
	Time time.Time
	// Message is the message text, unescaped ("\x0a" in /dev/kmsg becomes a
	// newline). A message printed over several lines keeps them, joined with
	// "\n", whichever rendering it came from.
	Message string
	// Raw is the input exactly as read: the /dev/kmsg record line, or the
	// text line(s) of a rendering joined with "\n". Findings quote it as
	// evidence.
	Raw string
	// Unparsed is true when the input could not be read as a record of the
	// expected format. Message and Raw then both hold the raw text, so nothing
	// is lost: detectors still look at it, and the parser counts it.
	Unparsed bool
}

// ErrContinuation is returned by ParseDevKmsg for a /dev/kmsg key/value
// continuation line (" SUBSYSTEM=pci", " DEVICE=+pci:0000:00:02.0"). Such a
// line belongs to the record before it and is not a record itself: skip it.
var ErrContinuation = errors.New("/dev/kmsg continuation line")

// ErrMalformed is returned (wrapped) by ParseDevKmsg for a line that is not a
// /dev/kmsg record.
var ErrMalformed = errors.New("malformed /dev/kmsg record")

// ParseDevKmsg parses one record in the /dev/kmsg format
//
//	<prio>,<seq>,<usec>,<flags>[,<more fields>];<message>[\n <key>=<value>...]
//
// where prio is facility<<3 | level, usec the monotonic timestamp in
// microseconds and flags "-", "c" or "+". Non-printable bytes and the
// backslash in the message are escaped as \xNN by the kernel and are
// unescaped here. A buffer returned by read(2) may carry key/value lines after
// the message; they are ignored. The returned Record has a zero Time (the
// format has no wall time) and Raw set to the record line.
//
// A line starting with a space is a key/value continuation: ParseDevKmsg
// returns ErrContinuation. Anything else that does not fit the format gives an
// error wrapping ErrMalformed.
func ParseDevKmsg(line string) (Record, error) {
	if len(line) > 0 && line[0] == ' ' {
		return Record{}, ErrContinuation
	}
	if i := strings.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	line = strings.TrimSuffix(line, "\r")
	semi := strings.IndexByte(line, ';')
	if semi < 0 {
		return Record{}, fmt.Errorf("parse devkmsg record: no ';' after the header: %w", ErrMalformed)
	}
	header := line[:semi]
	// Fields: prio, seq, usec, flags, then optional extras (e.g. caller=T123).
	var fields [4]string
	n := 0
	for n < 4 {
		j := strings.IndexByte(header, ',')
		if j < 0 {
			fields[n] = header
			n++
			break
		}
		fields[n] = header[:j]
		header = header[j+1:]
		n++
	}
	if n < 4 {
		return Record{}, fmt.Errorf("parse devkmsg record: header has %d fields, want at least 4: %w", n, ErrMalformed)
	}
	prio, err := strconv.ParseUint(fields[0], 10, 16)
	if err != nil {
		return Record{}, fmt.Errorf("parse devkmsg record: prio %q: %w", fields[0], ErrMalformed)
	}
	seq, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return Record{}, fmt.Errorf("parse devkmsg record: seq %q: %w", fields[1], ErrMalformed)
	}
	usec, err := strconv.ParseInt(fields[2], 10, 64)
	if err != nil || usec < 0 {
		return Record{}, fmt.Errorf("parse devkmsg record: usec %q: %w", fields[2], ErrMalformed)
	}
	return Record{
		Seq:      seq,
		Prio:     int(prio & 7),
		Facility: int(prio >> 3),
		Usec:     usec,
		Message:  unescape(line[semi+1:]),
		Raw:      line,
	}, nil
}

// unescape replaces the kernel's \xNN escapes with the bytes they stand for.
// A backslash not followed by x and two hex digits is kept as it is. The
// common case (no escape) returns s without allocating.
func unescape(s string) string {
	i := strings.Index(s, `\x`)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for {
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		s = s[i:]
		if len(s) >= 4 {
			hi, ok1 := unhex(s[2])
			lo, ok2 := unhex(s[3])
			if ok1 && ok2 {
				b.WriteByte(hi<<4 | lo)
				s = s[4:]
				i = strings.Index(s, `\x`)
				continue
			}
		}
		b.WriteString(s[:2])
		s = s[2:]
		i = strings.Index(s, `\x`)
	}
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
