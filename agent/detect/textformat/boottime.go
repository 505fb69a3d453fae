package textformat

import (
	"bytes"
	"regexp"
	"strconv"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// Boot time sources (Result.BootTimeSource): where the wall-clock time of
// the input's boot came from.
const (
	BootTimeFlag   = "flag"          // Options.BootTime (scan --boot-time)
	BootTimeBtime  = "btime"         // a "btime N" line of /proc/stat (seconds since the epoch)
	BootTimeUptime = "uptime-s"      // an "uptime -s" line ("2026-01-04 18:01:22")
	BootTimeWho    = "who-b"         // a "who -b" line ("system boot  2026-01-04 18:01")
	BootTimeRecord = "kernel-record" // a kernel record with both a wall-clock time and a time since boot (syslog "kernel: [7510.12] ...")
)

var (
	btimeLine   = regexp.MustCompile(`(?m)^\s*btime (\d{9,11})\s*$`)
	uptimeSince = regexp.MustCompile(`(?m)^\s*(?:\$ uptime -s\s*\n\s*)?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s*$`)
	whoBoot     = regexp.MustCompile(`(?m)^\s*system boot\s+(\d{4}-\d\d-\d\d \d\d:\d\d)\s*$`)
)

// SniffBootTime finds the wall-clock time of the boot an input belongs to in
// its head: a "btime" line of /proc/stat, an "uptime -s" or "who -b" line
// saved with the log, or a kernel record that carries both a wall-clock time
// and a time since boot (syslog and journalctl lines with the kernel's
// "[seconds.micros]" prefix): boot = wall time - time since boot, to the
// second. Times without a zone ("uptime -s", "who -b") are read as UTC, as
// the agent's nodes run. It returns the zero Time and "" when the head says
// nothing of the boot.
func SniffBootTime(head []byte) (time.Time, string) {
	if m := btimeLine.FindSubmatch(head); m != nil {
		if s, err := strconv.ParseInt(string(m[1]), 10, 64); err == nil {
			return time.Unix(s, 0).UTC(), BootTimeBtime
		}
	}
	if m := uptimeSince.FindSubmatch(head); m != nil {
		if t, err := time.Parse(time.DateTime, string(m[1])); err == nil {
			return t.UTC(), BootTimeUptime
		}
	}
	if m := whoBoot.FindSubmatch(head); m != nil {
		if t, err := time.Parse("2006-01-02 15:04", string(m[1])); err == nil {
			return t.UTC(), BootTimeWho
		}
	}
	p := kmsg.NewTextParser(bytes.NewReader(head), kmsg.FormatAuto, kmsg.TextOptions{})
	for i := 0; i < 4096; i++ {
		rec, ok := p.Next()
		if !ok {
			break
		}
		if !rec.Time.IsZero() && rec.Usec >= 0 && rec.Time.Year() > 1970 {
			return rec.Time.Add(-time.Duration(rec.Usec) * time.Microsecond).UTC().Truncate(time.Second), BootTimeRecord
		}
	}
	return time.Time{}, ""
}
