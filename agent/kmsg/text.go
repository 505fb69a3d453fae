package kmsg

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Format names a text rendering of the kernel log (cases/README.md, "Input
// file names").
type Format string

// Text formats understood by ParseText.
const (
	// FormatAuto detects the format of every line on its own, so a file that
	// mixes renderings (or a paste from several tools) still parses.
	FormatAuto Format = "auto"
	// FormatDevKmsg is the /dev/kmsg record format, one record per line:
	// "<prio>,<seq>,<usec>,<flags>;<message>" (see ParseDevKmsg). Also
	// accepted as "kmsg".
	FormatDevKmsg Format = "devkmsg"
	// FormatDmesg is plain dmesg: "[seconds.micros] text". A message printed
	// over several lines continues on lines indented by whitespace.
	FormatDmesg Format = "dmesg"
	// FormatDmesgCtime is dmesg --ctime / -T: "[Fri Aug 30 11:43:09 2024] text",
	// local time of the machine that printed it.
	FormatDmesgCtime Format = "dmesg-ctime"
	// FormatDmesgRelative is dmesg -H: "[  +0.000844] text" deltas between
	// lines (and "[Aug30 11:43]" minute marks). No absolute time is known.
	FormatDmesgRelative Format = "dmesg-relative"
	// FormatSyslog is a syslog file: "Mon DD HH:MM:SS host kernel: [uptime] text";
	// the "[uptime]" is optional. Lines of other programs are skipped.
	FormatSyslog Format = "syslog"
	// FormatJournalctlK is journalctl -k / --dmesg output:
	// "[Mon DD HH:MM:SS] [host] kernel: text", timestamp and host optional.
	FormatJournalctlK Format = "journalctl-k"
)

// Formats lists every Format, FormatAuto first.
func Formats() []Format {
	return []Format{FormatAuto, FormatDevKmsg, FormatDmesg, FormatDmesgCtime,
		FormatDmesgRelative, FormatSyslog, FormatJournalctlK}
}

// ErrUnknownFormat is returned (wrapped) by ParseFormat.
var ErrUnknownFormat = errors.New("unknown kernel log format")

// ParseFormat returns the Format named s ("kmsg" is an alias of "devkmsg").
func ParseFormat(s string) (Format, error) {
	if s == "kmsg" {
		return FormatDevKmsg, nil
	}
	for _, f := range Formats() {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, 0, 8)
	for _, f := range Formats() {
		names = append(names, string(f))
	}
	return "", fmt.Errorf("parse format %q (want one of %s, kmsg): %w", s, strings.Join(names, ", "), ErrUnknownFormat)
}

// TextOptions tune ParseText and NewTextParser. The zero value is ready to use.
type TextOptions struct {
	// Location is the time zone of timestamps that carry none (dmesg --ctime,
	// syslog, journalctl). Default: time.Local, the zone those tools print in.
	Location *time.Location
	// Year completes syslog and journalctl dates, which carry no year.
	// Default: the latest year that puts the date no later than Now plus
	// MaxZoneAhead (CompleteYear): a log from last December read in
	// January is last year's, "Dec  2" read on Dec 1 is last year's too.
	Year int
	// Now is the time the year is guessed against; default time.Now().
	Now time.Time
	// MaxLineBytes cuts longer lines (the rest of the line is discarded and
	// counted in TextStats.Truncated). Default 64 KiB; the kernel's own limit
	// for one record is 8 KiB.
	MaxLineBytes int
}

// TextStats counts what a text parser read. Every input line is counted in
// exactly one of Records (first line of a record, parsed or not),
// Continuations, KeyValues, Blank and Skipped.
type TextStats struct {
	Lines         uint64 // physical lines read
	Records       uint64 // records returned, Unparsed ones included
	Unparsed      uint64 // lines that fit no format; returned as raw records (Record.Unparsed)
	Continuations uint64 // indented lines appended to the record before them
	KeyValues     uint64 // /dev/kmsg " KEY=value" lines, skipped
	Blank         uint64 // empty lines, skipped
	Skipped       uint64 // syslog lines of programs other than the kernel, journalctl "-- ... --" markers
	Truncated     uint64 // lines longer than MaxLineBytes, cut
}

// TextParser reads records from a text rendering of the kernel log, one at a
// time. It is not safe for concurrent use.
type TextParser struct {
	r       *bufio.Reader
	format  Format
	loc     *time.Location
	year    int
	maxLine int
	now     time.Time // when the parser was made; guesses the year
	guess   bool      // year was not given

	pending    *Record
	pendingFmt Format // format the pending record was read in
	stats      TextStats
	err        error
	eof        bool
	rawLines   []string // physical lines of the pending record
}

// NewTextParser returns a parser reading r in the given format. It reads
// lazily; call Next until it returns false, then Err.
func NewTextParser(r io.Reader, format Format, opts TextOptions) *TextParser {
	p := &TextParser{
		r:       bufio.NewReaderSize(r, 64*1024),
		format:  format,
		loc:     opts.Location,
		year:    opts.Year,
		maxLine: opts.MaxLineBytes,
	}
	if p.loc == nil {
		p.loc = time.Local
	}
	p.now = opts.Now
	if p.now.IsZero() {
		p.now = time.Now()
	}
	p.now = p.now.In(p.loc)
	if p.year == 0 {
		p.year, p.guess = p.now.Year(), true
	}
	if p.maxLine <= 0 {
		p.maxLine = 64 * 1024
	}
	return p
}

// ParseText reads all records of r. Lines that fit no format are returned as
// Unparsed records and counted, never dropped; only a read error from r is an
// error (the records read before it are returned with it).
func ParseText(r io.Reader, format Format, opts TextOptions) ([]Record, TextStats, error) {
	p := NewTextParser(r, format, opts)
	var recs []Record
	for {
		rec, ok := p.Next()
		if !ok {
			break
		}
		recs = append(recs, rec)
	}
	return recs, p.Stats(), p.Err()
}

// Stats returns the counters so far.
func (p *TextParser) Stats() TextStats { return p.stats }

// Err returns the first read error of the underlying reader, nil at a clean
// end of input.
func (p *TextParser) Err() error { return p.err }

// Next returns the next record. A record is complete only when the line after
// it has been read (it may continue on indented lines), so Next reads one line
// ahead. It returns false at the end of the input or on a read error.
func (p *TextParser) Next() (Record, bool) {
	for !p.eof {
		line, ok := p.readLine()
		if !ok {
			p.eof = true
			break
		}
		p.stats.Lines++
		if strings.TrimSpace(line) == "" {
			p.stats.Blank++
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if p.isKeyValue(line) {
				p.stats.KeyValues++
				continue
			}
			if p.pending != nil {
				p.stats.Continuations++
				p.pending.Message += "\n" + strings.TrimLeft(line, " \t")
				p.rawLines = append(p.rawLines, line)
				continue
			}
		}
		rec, f, kind := p.parseLine(line)
		switch kind {
		case lineSkipped:
			p.stats.Skipped++
			continue
		case lineUnparsed:
			p.stats.Unparsed++
		}
		p.stats.Records++
		out, have := p.take()
		p.pending, p.pendingFmt, p.rawLines = &rec, f, append(p.rawLines[:0], line)
		if have {
			return out, true
		}
	}
	return p.take()
}

// take returns the pending record, completed with its raw lines.
func (p *TextParser) take() (Record, bool) {
	if p.pending == nil {
		return Record{}, false
	}
	rec := *p.pending
	if len(p.rawLines) > 1 {
		rec.Raw = strings.Join(p.rawLines, "\n")
	}
	p.pending = nil
	return rec, true
}

// isKeyValue tells a /dev/kmsg " KEY=value" continuation from an indented
// dmesg continuation line.
func (p *TextParser) isKeyValue(line string) bool {
	switch {
	case p.format == FormatDevKmsg:
		return true
	case p.format != FormatAuto || p.pendingFmt != FormatDevKmsg:
		return false
	}
	// " SUBSYSTEM=pci": one space, then an upper-case key and '='.
	if len(line) < 3 || line[1] == ' ' {
		return false
	}
	eq := strings.IndexByte(line, '=')
	if eq < 2 {
		return false
	}
	for _, c := range line[1:eq] {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// readLine returns the next line without its line ending, cut at maxLine.
func (p *TextParser) readLine() (string, bool) {
	var buf []byte
	truncated := false
	for {
		chunk, err := p.r.ReadSlice('\n')
		if len(buf)+len(chunk) > p.maxLine {
			if room := p.maxLine - len(buf); room > 0 {
				buf = append(buf, chunk[:room]...)
			}
			truncated = true
		} else {
			buf = append(buf, chunk...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil && err != io.EOF {
			p.err = fmt.Errorf("read kernel log: %w", err)
			return "", false
		}
		if err == io.EOF && len(buf) == 0 && !truncated {
			return "", false
		}
		break
	}
	if truncated {
		p.stats.Truncated++
	}
	s := string(buf)
	s = strings.TrimSuffix(s, "\n")
	s = strings.TrimSuffix(s, "\r")
	return s, true
}

type lineKind int

const (
	lineRecord lineKind = iota
	lineUnparsed
	lineSkipped
)

// parseLine reads one line in p.format (or, for FormatAuto, in whichever
// format fits) and returns the record and the format it was read in.
func (p *TextParser) parseLine(line string) (Record, Format, lineKind) {
	var (
		rec  Record
		kind = lineUnparsed
		f    = p.format
	)
	switch p.format {
	case FormatDevKmsg:
		if r, err := ParseDevKmsg(line); err == nil {
			rec, kind = r, lineRecord
		}
	case FormatDmesg:
		rec, kind = p.parseDmesg(line)
	case FormatDmesgCtime:
		rec, kind = p.parseDmesgCtime(line)
	case FormatDmesgRelative:
		rec, kind = p.parseDmesgRelative(line)
	case FormatSyslog, FormatJournalctlK:
		rec, kind = p.parseSyslog(line)
	default: // FormatAuto
		rec, f, kind = p.parseAuto(line)
	}
	if kind == lineUnparsed {
		rec = Record{Prio: PrioUnknown, Facility: FacilityUnknown, Usec: -1,
			Message: line, Raw: line, Unparsed: true}
	}
	return rec, f, kind
}

func (p *TextParser) parseAuto(line string) (Record, Format, lineKind) {
	switch c := line[0]; {
	case c == '[':
		if rec, k := p.parseDmesg(line); k != lineUnparsed {
			return rec, FormatDmesg, k
		}
		if rec, k := p.parseDmesgRelative(line); k != lineUnparsed {
			return rec, FormatDmesgRelative, k
		}
		if rec, k := p.parseDmesgCtime(line); k != lineUnparsed {
			return rec, FormatDmesgCtime, k
		}
	case c >= '0' && c <= '9':
		if rec, err := ParseDevKmsg(line); err == nil {
			return rec, FormatDevKmsg, lineRecord
		}
	}
	rec, k := p.parseSyslog(line)
	return rec, FormatSyslog, k
}

// bracket splits "[inside] message" into inside and message (one space after
// the bracket is dropped, further spaces are part of the message).
func bracket(line string) (inside, msg string, ok bool) {
	if len(line) < 2 || line[0] != '[' {
		return "", "", false
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return "", "", false
	}
	msg = line[end+1:]
	msg = strings.TrimPrefix(msg, " ")
	return line[1:end], msg, true
}

// parseUptime reads "seconds.fraction" (digits only, surrounding spaces
// allowed) into microseconds.
func parseUptime(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	dot := strings.IndexByte(s, '.')
	if dot <= 0 || dot == len(s)-1 || dot > 12 || len(s)-dot-1 > 9 {
		return 0, false
	}
	var sec, frac int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == dot:
		case c < '0' || c > '9':
			return 0, false
		case i < dot:
			sec = sec*10 + int64(c-'0')
		default:
			frac = frac*10 + int64(c-'0')
		}
	}
	for i := len(s) - dot - 1; i < 6; i++ {
		frac *= 10
	}
	for i := len(s) - dot - 1; i > 6; i-- {
		frac /= 10
	}
	return sec*1_000_000 + frac, true
}

func (p *TextParser) parseDmesg(line string) (Record, lineKind) {
	inside, msg, ok := bracket(line)
	if !ok {
		return Record{}, lineUnparsed
	}
	usec, ok := parseUptime(inside)
	if !ok {
		return Record{}, lineUnparsed
	}
	return Record{Prio: PrioUnknown, Facility: FacilityUnknown, Usec: usec, Message: msg, Raw: line}, lineRecord
}

// ctimeLayout is dmesg --ctime's asctime-like "%a %b %e %H:%M:%S %Y".
const ctimeLayout = "Mon Jan _2 15:04:05 2006"

func (p *TextParser) parseDmesgCtime(line string) (Record, lineKind) {
	inside, msg, ok := bracket(line)
	if !ok {
		return Record{}, lineUnparsed
	}
	t, err := time.ParseInLocation(ctimeLayout, strings.TrimSpace(inside), p.loc)
	if err != nil {
		return Record{}, lineUnparsed
	}
	return Record{Prio: PrioUnknown, Facility: FacilityUnknown, Usec: -1, Time: t, Message: msg, Raw: line}, lineRecord
}

// parseDmesgRelative reads dmesg -H lines: "[  +0.000844] text" deltas and the
// "[Aug30 11:43] text" minute marks. Neither gives an absolute time we can
// trust (the mark has no year and minute precision), so Time stays zero.
func (p *TextParser) parseDmesgRelative(line string) (Record, lineKind) {
	inside, msg, ok := bracket(line)
	if !ok {
		return Record{}, lineUnparsed
	}
	in := strings.TrimSpace(inside)
	switch {
	case strings.HasPrefix(in, "+"):
		if _, ok := parseUptime(strings.TrimPrefix(in, "+")); !ok {
			return Record{}, lineUnparsed
		}
	default:
		if _, err := time.Parse("Jan2 15:04", in); err != nil {
			return Record{}, lineUnparsed
		}
	}
	return Record{Prio: PrioUnknown, Facility: FacilityUnknown, Usec: -1, Message: msg, Raw: line}, lineRecord
}

// parseSyslog reads syslog and journalctl lines:
//
//	[<timestamp>] [<host>] <tag>: [\[<uptime>\]] <message>
//
// with <timestamp> "Dec  2 11:38:27" (optionally with fractional seconds) or
// ISO 8601 ("2024-08-30T11:43:09+0000", journalctl -o short-iso). Only tag
// "kernel" gives a record; other tags are skipped; journalctl's "-- ... --"
// markers too. rsyslog's "#012" escape for a newline is undone.
func (p *TextParser) parseSyslog(line string) (Record, lineKind) {
	if strings.HasPrefix(line, "-- ") {
		return Record{}, lineSkipped
	}
	rest := line
	var t time.Time
	if tok, after, ok := strings.Cut(rest, " "); ok && len(tok) >= 10 && tok[4] == '-' && tok[0] >= '0' && tok[0] <= '9' {
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05-0700", "2006-01-02T15:04:05"} {
			if v, err := time.ParseInLocation(layout, tok, p.loc); err == nil {
				t, rest = v, strings.TrimLeft(after, " ")
				break
			}
		}
		if t.IsZero() {
			return Record{}, lineUnparsed
		}
	} else if len(rest) >= 15 && isMonth(rest[:3]) && rest[3] == ' ' {
		// "Dec  2 11:38:27" or "Mar 29 15:38:59.123456"
		end := 15
		for end < len(rest) && rest[end] != ' ' {
			end++
		}
		v, err := time.ParseInLocation("Jan _2 15:04:05", rest[:end], p.loc)
		if err != nil {
			return Record{}, lineUnparsed
		}
		if p.guess {
			t = CompleteYear(v, p.now)
		} else {
			t = time.Date(p.year, v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), p.loc)
		}
		rest = strings.TrimLeft(rest[end:], " ")
	}
	// Now "[host ]tag: message".
	tag, msg, ok := strings.Cut(rest, ": ")
	if !ok {
		tag, ok = strings.CutSuffix(rest, ":")
		msg = ""
		if !ok {
			return Record{}, lineUnparsed
		}
	}
	if sp := strings.LastIndexByte(tag, ' '); sp >= 0 {
		if strings.Contains(tag[:sp], " ") {
			return Record{}, lineUnparsed // more than "host tag": not a syslog header
		}
		tag = tag[sp+1:]
	}
	if tag != "kernel" {
		if t.IsZero() || !isTag(tag) {
			return Record{}, lineUnparsed
		}
		return Record{}, lineSkipped
	}
	rec := Record{Prio: PrioUnknown, Facility: FacilityKernel, Usec: -1, Time: t, Raw: line}
	if inside, m, ok := bracket(msg); ok {
		if usec, ok := parseUptime(inside); ok {
			rec.Usec, msg = usec, m
		}
	}
	rec.Message = strings.ReplaceAll(msg, "#012", "\n")
	return rec, lineRecord
}

// MaxZoneAhead is the largest time-zone offset ahead of UTC (UTC+14,
// Line Islands): a log line stamped in local time is at most this far ahead
// of the reader's clock, whatever zone the node printed it in.
const MaxZoneAhead = 14 * time.Hour

// CompleteYear gives a date read without a year (syslog "Dec  2 11:38:27",
// glog "I1202 11:38:27"; v's year is ignored, its location kept) the latest
// year that puts it no later than now + MaxZoneAhead: a log line cannot come
// from the future. So on 2026-12-01 "Dec  2 11:38" is 2025-12-02, on
// 2027-01-01 "Dec 31" is 2026-12-31, and on 2026-12-31 at 23:00 UTC a
// "Jan  1 05:00" stamped by a node in a zone already in the new year is
// 2027-01-01. Feb 29 goes to the latest leap year that fits.
func CompleteYear(v, now time.Time) time.Time {
	limit := now.Add(MaxZoneAhead)
	for y := now.Year() + 1; y > now.Year()-9; y-- {
		t := time.Date(y, v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), v.Location())
		if t.Month() == v.Month() && !t.After(limit) {
			return t
		}
	}
	return time.Date(now.Year()-1, v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), v.Location())
}

func isMonth(s string) bool {
	switch s {
	case "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec":
		return true
	}
	return false
}

// isTag reports whether s looks like a syslog program tag ("systemd[1]").
func isTag(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c == ' ' || c == ':' {
			return false
		}
	}
	return true
}
