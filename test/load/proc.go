package load

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/PID/stat: 100 on
// every Linux architecture Go supports (sysconf(_SC_CLK_TCK)).
const clockTicks = 100

// procStat is one process's line of /proc/PID/stat, the fields used here.
type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64 // clock ticks
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, fmt.Errorf("read /proc/%d/stat: %w", pid, err)
	}
	// The command name may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); ppid is field 4, utime..cstime fields 14..17.
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	return procStat{ppid: int(n(1)), utime: n(11), stime: n(12), cutime: n(13), cstime: n(14)}, nil
}

// cpuSeconds is the CPU time (user+system) of pid, and, with children, of its
// reaped children too (cutime, cstime).
func cpuSeconds(pid int, children bool) (float64, error) {
	s, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	t := s.utime + s.stime
	if children {
		t += s.cutime + s.cstime
	}
	return float64(t) / clockTicks, nil
}

// treeCPUSeconds is the CPU time of a server process and every child it has
// or had: the postmaster's own and reaped children's times plus the live
// children's (PostgreSQL's backends, checkpointer, WAL writer, ...).
func treeCPUSeconds(pid int) (float64, error) {
	total, err := cpuSeconds(pid, true)
	if err != nil {
		return 0, err
	}
	pids, err := processes()
	if err != nil {
		return 0, err
	}
	for _, child := range pids {
		s, err := readStat(child)
		if err != nil || s.ppid != pid {
			continue // gone meanwhile, or not a child
		}
		total += float64(s.utime+s.stime) / clockTicks
	}
	return total, nil
}

// processes lists the PIDs in /proc (processes may end meanwhile).
func processes() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// rssBytes is the resident set size of pid (VmRSS of /proc/PID/status).
func rssBytes(pid int) (int64, error) {
	return procKB(filepath.Join("/proc", strconv.Itoa(pid), "status"), "VmRSS")
}

// procKB reads the field "NAME:   N kB" of a /proc file such as
// /proc/PID/status or /proc/meminfo, in bytes. Errors name the file and
// the field.
func procKB(path, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s %q of %s: %w", name, v, path, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("read %s: no %s", path, name)
}

// loadAverage is the machine's 1-minute load average, the first field of
// /proc/loadavg.
func loadAverage() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, fmt.Errorf("read /proc/loadavg: %w", err)
	}
	return parseLoadAvg(b)
}

// parseLoadAvg reads the 1-minute load average of a /proc/loadavg line
// ("1.62 1.48 1.35 3/412 12345").
func parseLoadAvg(b []byte) (float64, error) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("parse /proc/loadavg %q: empty", b)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/loadavg %q: %w", b, err)
	}
	return v, nil
}

// apiRequests is apiserver_request_total from the API server's /metrics
// text: the sum over every label set, and per "VERB resource".
type apiRequests struct {
	total float64
	by    map[string]float64
	at    time.Time
}

func parseAPIRequests(text []byte, at time.Time) apiRequests {
	out := apiRequests{by: map[string]float64{}, at: at}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		end := strings.LastIndexByte(rest, '}')
		if end < 0 {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest[end+1:]), 64)
		if err != nil {
			continue
		}
		labels := rest[:end]
		out.total += v
		out.by[label(labels, "verb")+" "+label(labels, "resource")] += v
	}
	return out
}

// label returns the value of name in a Prometheus label list `a="x",b="y"`.
func label(labels, name string) string {
	i := strings.Index(","+labels, ","+name+`="`)
	if i < 0 {
		return ""
	}
	v := labels[i+len(name)+2:]
	if j := strings.IndexByte(v, '"'); j >= 0 {
		return v[:j]
	}
	return v
}
