package kmsg

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestParseFormat(t *testing.T) {
	t.Parallel()
	for _, f := range Formats() {
		if got, err := ParseFormat(string(f)); err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %q, %v", f, got, err)
		}
	}
	if got, err := ParseFormat("kmsg"); err != nil || got != FormatDevKmsg {
		t.Errorf("ParseFormat(kmsg) = %q, %v, want devkmsg", got, err)
	}
	if _, err := ParseFormat("json"); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("ParseFormat(json) error = %v, want ErrUnknownFormat", err)
	}
}

// want is the part of a Record a text test checks.
type want struct {
	msg      string
	usec     int64
	time     string // RFC 3339, "" for zero
	facility int
	unparsed bool
}

func TestParseText(t *testing.T) {
	t.Parallel()
	opts := TextOptions{Location: time.UTC, Year: 2024}
	tests := []struct {
		name   string
		format Format
		input  string
		want   []want
		stats  TextStats
	}{
		{
			name:   "dmesg with continuation lines (c02)",
			format: FormatDmesg,
			input: "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n" +
				"               NVRM: (PCI ID: 10de:26b5) installed in this system has\n" +
				"               NVRM: fallen off the bus and is not responding to commands.\n" +
				"[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n",
			want: []want{
				{msg: "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands.", usec: 1843308145, facility: -1},
				{msg: "NVRM: The NVIDIA probe routine failed for 1 device(s).", usec: 1843439662, facility: -1},
			},
			stats: TextStats{Lines: 4, Records: 2, Continuations: 2},
		},
		{
			name:   "dmesg keeps inner and trailing spaces, short fractions scale",
			format: FormatDmesg,
			input:  "[74785.660559] pcieport 0000:00:02.0:    [12] Replay Timer Timeout  \n[    2.5] x\n",
			want: []want{
				{msg: "pcieport 0000:00:02.0:    [12] Replay Timer Timeout  ", usec: 74785660559, facility: -1},
				{msg: "x", usec: 2500000, facility: -1},
			},
			stats: TextStats{Lines: 2, Records: 2},
		},
		{
			name:   "dmesg --ctime (c03)",
			format: FormatDmesgCtime,
			input:  "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, x\n[Mon Sep  2 01:02:03 2024] y\n",
			want: []want{
				{msg: "NVRM: Xid (PCI:0000:cb:00): 13, x", usec: -1, time: "2024-08-30T11:43:09Z", facility: -1},
				{msg: "y", usec: -1, time: "2024-09-02T01:02:03Z", facility: -1},
			},
			stats: TextStats{Lines: 2, Records: 2},
		},
		{
			name:   "dmesg -H deltas and minute marks (c18)",
			format: FormatDmesgRelative,
			input:  "[Aug30 11:43] a\n[  +0.000844] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)\n",
			want: []want{
				{msg: "a", usec: -1, facility: -1},
				{msg: "nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)", usec: -1, facility: -1},
			},
			stats: TextStats{Lines: 2, Records: 2},
		},
		{
			name:   "syslog with uptime, other programs skipped (c05)",
			format: FormatSyslog,
			input: "Dec  2 11:38:27 node-a1 kernel: [  199.234935] NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5\n" +
				"Dec  2 11:38:28 node-a1 systemd[1]: Started foo.\n" +
				"Dec  2 11:38:29 node-a1 kernel: no uptime#012second line\n",
			want: []want{
				{msg: "NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5", usec: 199234935, time: "2024-12-02T11:38:27Z"},
				{msg: "no uptime\nsecond line", usec: -1, time: "2024-12-02T11:38:29Z"},
			},
			stats: TextStats{Lines: 3, Records: 2, Skipped: 1},
		},
		{
			name:   "journalctl -k with and without timestamps, markers and blank lines (c04, c09)",
			format: FormatJournalctlK,
			input: "-- Boot 0123456789abcdef --\n" +
				"Mar 29 15:38:59 kernel: NVRM: Xid (PCI:0000:01:00): 120, GSP\n" +
				"\n" +
				"kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1\n" +
				"Mar 29 15:39:00.123456 node-a1 kernel: z\n" +
				"2024-03-29T15:39:01+0000 node-a1 kernel: iso\n",
			want: []want{
				{msg: "NVRM: Xid (PCI:0000:01:00): 120, GSP", usec: -1, time: "2024-03-29T15:38:59Z"},
				{msg: "NVRM: Xid (PCI:0000:dc:00): 45, pid=1", usec: -1},
				{msg: "z", usec: -1, time: "2024-03-29T15:39:00.123456Z"},
				{msg: "iso", usec: -1, time: "2024-03-29T15:39:01Z"},
			},
			stats: TextStats{Lines: 6, Records: 4, Blank: 1, Skipped: 1},
		},
		{
			name:   "devkmsg with key/value lines and CRLF",
			format: FormatDevKmsg,
			input:  "6,1,10,-;a\r\n SUBSYSTEM=pci\r\n DEVICE=+pci:0000:00:02.0\r\n6,2,20,-;b\r\n",
			want: []want{
				{msg: "a", usec: 10},
				{msg: "b", usec: 20},
			},
			stats: TextStats{Lines: 4, Records: 2, KeyValues: 2},
		},
		{
			name:   "unparsed lines are kept and counted",
			format: FormatDmesg,
			input:  "garbage NVRM: Xid (PCI:0000:01:00): 79, x\n[ 1.000000] ok\n   indented continuation\n",
			want: []want{
				{msg: "garbage NVRM: Xid (PCI:0000:01:00): 79, x", usec: -1, facility: -1, unparsed: true},
				{msg: "ok\nindented continuation", usec: 1000000, facility: -1},
			},
			stats: TextStats{Lines: 3, Records: 2, Unparsed: 1, Continuations: 1},
		},
		{
			name:   "an indented first line has nothing to continue",
			format: FormatDmesg,
			input:  "   orphan\n",
			want:   []want{{msg: "   orphan", usec: -1, facility: -1, unparsed: true}},
			stats:  TextStats{Lines: 1, Records: 1, Unparsed: 1},
		},
		{
			name:   "auto detects every line on its own",
			format: FormatAuto,
			input: "3,912,1843308145,-;NVRM: a\\x0ab\n" +
				" SUBSYSTEM=pci\n" +
				"[ 1843.439662] dmesg\n" +
				"               continued\n" +
				"[Fri Aug 30 11:43:09 2024] ctime\n" +
				"[  +0.000844] relative\n" +
				"Dec  2 11:38:27 node-a1 kernel: [  199.234935] syslog\n" +
				"kernel: journal\n" +
				"something else\n",
			want: []want{
				{msg: "NVRM: a\nb", usec: 1843308145},
				{msg: "dmesg\ncontinued", usec: 1843439662, facility: -1},
				{msg: "ctime", usec: -1, time: "2024-08-30T11:43:09Z", facility: -1},
				{msg: "relative", usec: -1, facility: -1},
				{msg: "syslog", usec: 199234935, time: "2024-12-02T11:38:27Z"},
				{msg: "journal", usec: -1},
				{msg: "something else", usec: -1, facility: -1, unparsed: true},
			},
			stats: TextStats{Lines: 9, Records: 7, Unparsed: 1, Continuations: 1, KeyValues: 1},
		},
		{
			name:   "wrong explicit format gives unparsed records, not silence",
			format: FormatDmesgCtime,
			input:  "[ 1.000000] NVRM: x\n",
			want:   []want{{msg: "[ 1.000000] NVRM: x", usec: -1, facility: -1, unparsed: true}},
			stats:  TextStats{Lines: 1, Records: 1, Unparsed: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			recs, stats, err := ParseText(strings.NewReader(tt.input), tt.format, opts)
			if err != nil {
				t.Fatalf("ParseText: %v", err)
			}
			if stats != tt.stats {
				t.Errorf("stats = %+v, want %+v", stats, tt.stats)
			}
			if len(recs) != len(tt.want) {
				t.Fatalf("got %d records, want %d: %+v", len(recs), len(tt.want), recs)
			}
			for i, r := range recs {
				w := tt.want[i]
				gotTime := ""
				if !r.Time.IsZero() {
					gotTime = r.Time.UTC().Format(time.RFC3339Nano)
				}
				if r.Message != w.msg || r.Usec != w.usec || gotTime != w.time || r.Facility != w.facility || r.Unparsed != w.unparsed {
					t.Errorf("record %d = {msg %q usec %d time %q facility %d unparsed %v}, want %+v",
						i, r.Message, r.Usec, gotTime, r.Facility, r.Unparsed, w)
				}
				if r.Raw == "" {
					t.Errorf("record %d: empty Raw", i)
				}
			}
		})
	}
}

func TestParseTextRawKeepsContinuationLines(t *testing.T) {
	t.Parallel()
	in := "[ 1.000000] a\n               b\n"
	recs, _, _ := ParseText(strings.NewReader(in), FormatDmesg, TextOptions{})
	if len(recs) != 1 || recs[0].Raw != strings.TrimSuffix(in, "\n") {
		t.Fatalf("records = %+v, want one with Raw %q", recs, in)
	}
}

func TestParseTextYearGuess(t *testing.T) {
	t.Parallel()
	// A date more than two days ahead of now belongs to last year.
	future := time.Now().UTC().AddDate(0, 0, 10)
	line := future.Format("Jan _2 15:04:05") + " h kernel: x\n"
	recs, _, _ := ParseText(strings.NewReader(line), FormatSyslog, TextOptions{Location: time.UTC})
	if len(recs) != 1 {
		t.Fatalf("got %d records", len(recs))
	}
	if got, want := recs[0].Time.Year(), future.Year()-1; got != want && !(future.Month() == time.February && future.Day() == 29) {
		t.Errorf("year = %d, want %d", got, want)
	}
}

func TestParseTextLongLinesAndErrors(t *testing.T) {
	t.Parallel()
	long := "[ 1.000000] " + strings.Repeat("x", 200) + "\n[ 2.000000] y\n"
	recs, stats, err := ParseText(strings.NewReader(long), FormatDmesg, TextOptions{MaxLineBytes: 50})
	if err != nil || len(recs) != 2 || len(recs[0].Raw) != 50 || stats.Truncated != 1 || recs[1].Message != "y" {
		t.Errorf("long line: recs %d, raw %d bytes, stats %+v, err %v", len(recs), len(recs[0].Raw), stats, err)
	}

	// A reader that returns one byte at a time still gives whole lines.
	recs, _, err = ParseText(iotest.OneByteReader(strings.NewReader("[ 1.000000] a\n[ 2.000000] b\n")), FormatDmesg, TextOptions{})
	if err != nil || len(recs) != 2 || recs[1].Message != "b" {
		t.Errorf("one-byte reader: %+v, %v", recs, err)
	}
	_, _, err = ParseText(iotest.ErrReader(io.ErrUnexpectedEOF), FormatDmesg, TextOptions{})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("read error = %v, want io.ErrUnexpectedEOF", err)
	}
	recs, _, err = ParseText(strings.NewReader("[ 1.000000] no newline at end"), FormatDmesg, TextOptions{})
	if err != nil || len(recs) != 1 || recs[0].Message != "no newline at end" {
		t.Errorf("last line without newline: %+v, %v", recs, err)
	}
}

func FuzzParseText(f *testing.F) {
	for _, glob := range []string{"input.kmsg.txt", "input.devkmsg.txt"} {
		for _, l := range fixtureLines(f, glob) {
			f.Add(l, uint8(0))
		}
	}
	f.Fuzz(func(t *testing.T, input string, fi uint8) {
		formats := Formats()
		format := formats[int(fi)%len(formats)]
		recs, stats, err := ParseText(strings.NewReader(input), format, TextOptions{Location: time.UTC, Year: 2024})
		if err != nil {
			t.Fatalf("ParseText: %v", err)
		}
		if uint64(len(recs)) != stats.Records {
			t.Errorf("%d records, stats say %d", len(recs), stats.Records)
		}
		if stats.Records+stats.Continuations+stats.KeyValues+stats.Blank+stats.Skipped != stats.Lines {
			t.Errorf("line accounting broken: %+v", stats)
		}
	})
}
