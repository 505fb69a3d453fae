package kmsg

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseDevKmsg(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		line    string
		want    Record
		wantErr error
	}{
		{
			name: "error record",
			line: "3,1055,74889644138,-;NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
			want: Record{Seq: 1055, Prio: 3, Facility: 0, Usec: 74889644138,
				Message: "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."},
		},
		{
			name: "user facility, as written by echo > /dev/kmsg",
			line: "11,333,393377342,-;NVRM: test",
			want: Record{Seq: 333, Prio: 3, Facility: 1, Usec: 393377342, Message: "NVRM: test"},
		},
		{
			name: "escaped newlines become a multi-line message (c02)",
			line: `3,912,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\x0aNVRM: (PCI ID: 10de:26b5) installed in this system has\x0aNVRM: fallen off the bus and is not responding to commands.`,
			want: Record{Seq: 912, Prio: 3, Usec: 1843308145,
				Message: "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."},
		},
		{
			name: "escaped backslash and bad escapes",
			line: `6,1,2,-;a\x5cb \xZZ \x4`,
			want: Record{Seq: 1, Prio: 6, Usec: 2, Message: `a\b \xZZ \x4`},
		},
		{
			name: "extra header fields and key/value lines of a read(2) buffer",
			line: "4,1044,74785660380,-,caller=T42;pcieport 0000:00:02.0: AER: msg\n SUBSYSTEM=pci\n DEVICE=+pci:0000:00:02.0\n",
			want: Record{Seq: 1044, Prio: 4, Usec: 74785660380, Message: "pcieport 0000:00:02.0: AER: msg"},
		},
		{
			name: "message with semicolons keeps them",
			line: "6,7,8,c;a;b",
			want: Record{Seq: 7, Prio: 6, Usec: 8, Message: "a;b"},
		},
		{name: "continuation line", line: " SUBSYSTEM=pci", wantErr: ErrContinuation},
		{name: "no separator", line: "6,7,8,-", wantErr: ErrMalformed},
		{name: "too few fields", line: "6,7;msg", wantErr: ErrMalformed},
		{name: "bad prio", line: "x,7,8,-;msg", wantErr: ErrMalformed},
		{name: "negative usec", line: "6,7,-8,-;msg", wantErr: ErrMalformed},
		{name: "dmesg line", line: "[ 1843.439662] NVRM: x", wantErr: ErrMalformed},
		{name: "empty", line: "", wantErr: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseDevKmsg(tt.line)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ParseDevKmsg(%q) error = %v, want %v", tt.line, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDevKmsg(%q): %v", tt.line, err)
			}
			tt.want.Raw = strings.SplitN(tt.line, "\n", 2)[0]
			if got != tt.want {
				t.Errorf("ParseDevKmsg(%q)\n got %+v\nwant %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestUnescapeNoAlloc(t *testing.T) {
	s := "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
	if n := testing.AllocsPerRun(100, func() { _ = unescape(s) }); n != 0 {
		t.Errorf("unescape of a plain message allocates %v times, want 0", n)
	}
}

// fixtureLines returns the lines of every input.devkmsg.txt of the corpus
// (fuzz seeds).
func fixtureLines(t testing.TB, glob string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("../../test/fixtures/cases", "*", glob))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.Split(strings.TrimRight(string(data), "\n"), "\n")...)
	}
	return lines
}

func FuzzParseDevKmsg(f *testing.F) {
	for _, l := range fixtureLines(f, "input.devkmsg.txt") {
		f.Add(l)
	}
	f.Add(" SUBSYSTEM=pci")
	f.Add(`6,1,2,-;\x`)
	f.Fuzz(func(t *testing.T, line string) {
		rec, err := ParseDevKmsg(line)
		if err != nil {
			return
		}
		if rec.Prio < 0 || rec.Prio > 7 || rec.Usec < 0 {
			t.Errorf("ParseDevKmsg(%q) = %+v: prio or usec out of range", line, rec)
		}
		if len(rec.Message) > len(line) {
			t.Errorf("ParseDevKmsg(%q): message longer than the line", line)
		}
		if strings.Contains(rec.Raw, "\n") {
			t.Errorf("ParseDevKmsg(%q): Raw holds a newline", line)
		}
	})
}
