// Command agentbench measures the node agent's cost on this machine, and
// node-problem-detector's kernel monitor side by side, in one run: CPU (in
// cores), peak RSS and wake-ups per second (context switches of all
// threads), first idle, then under a kernel-log flood written into the real
// /dev/kmsg.
//
// Both read the real /dev/kmsg. Lines are injected by this process at
// -rate lines/s; /dev/kmsg rate-limits writers per open file (a burst of 10
// records per 5 s unless kernel.printk_devkmsg=on), so the injector opens
// the device once per 10 lines. Injected lines come from user space, so the
// agent runs with --accept-user-facility (its detectors then see them, as
// they would kernel lines). Noise lines carry the marker FRBENCH; once a
// second an NVRM Xid line on the unused address 0000:fe:00.0 gives both a
// rule to match (node-problem-detector gets the same rule added to its
// shipped kernel-monitor.json).
//
// Run it with `make bench-agent` (root, Linux). It prints a table and the
// agent/NPD ratio; figures are for reports, never asserted in tests.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// clkTck is USER_HZ, the unit of utime/stime in /proc/PID/stat (100 on Linux).
const clkTck = 100

func main() {
	agentBin := flag.String("agent", ".tools/bin/fleetrepair-agent", "agent binary")
	npdBin := flag.String("npd", ".tools/bin/node-problem-detector", "node-problem-detector binary (empty: skip)")
	npdConfig := flag.String("npd-config", "", "NPD kernel-monitor.json (default: the shipped one from the module cache, plus an NVRM Xid rule)")
	idle := flag.Duration("idle", 30*time.Second, "idle phase")
	flood := flag.Duration("flood", 20*time.Second, "flood phase")
	rate := flag.Int("rate", 5000, "flood lines per second")
	settle := flag.Duration("settle", 5*time.Second, "wait after start before measuring")
	out := flag.String("out", ".tools/agentbench", "folder for logs")
	agentArgs := flag.String("agent-args", "", "extra agent flags, space separated")
	flag.Parse()
	if err := run(*agentBin, *npdBin, *npdConfig, *out, strings.Fields(*agentArgs), *idle, *flood, *settle, *rate); err != nil {
		fmt.Fprintln(os.Stderr, "agentbench:", err)
		os.Exit(1)
	}
}

// sample is one reading of a process.
type sample struct {
	ticks  uint64 // utime+stime, clock ticks
	ctxsw  uint64 // voluntary+nonvoluntary switches, all threads
	rssKiB uint64
	at     time.Time
}

func read(pid int) (sample, error) {
	s := sample{at: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("read stat: %w", err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if f[0] == "Z" || f[0] == "X" {
		return s, fmt.Errorf("process %d has exited", pid)
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64) // field 14 (utime), 0-based after the comm
	st, _ := strconv.ParseUint(f[12], 10, 64)
	s.ticks = ut + st
	st2, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read status: %w", err)
	}
	s.rssKiB = field(string(st2), "VmRSS")
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		s.ctxsw += field(string(b), "voluntary_ctxt_switches") + field(string(b), "nonvoluntary_ctxt_switches")
	}
	return s, nil
}

func field(status, key string) uint64 {
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			n, _ := strconv.ParseUint(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

// phase is the figures of one process over one phase.
type phase struct {
	cores, wakeups float64
	peakRSS        uint64
}

// measure samples pids every second for d, running load meanwhile.
func measure(pids map[string]int, d time.Duration, load func(ctx context.Context)) (map[string]phase, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := map[string]sample{}
	peak := map[string]uint64{}
	for name, pid := range pids {
		s, err := read(pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		start[name], peak[name] = s, s.rssKiB
	}
	var wg sync.WaitGroup
	if load != nil {
		wg.Add(1)
		go func() { defer wg.Done(); load(ctx) }()
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-t.C:
		}
		for name, pid := range pids {
			if s, err := read(pid); err == nil && s.rssKiB > peak[name] {
				peak[name] = s.rssKiB
			}
		}
	}
	wg.Wait()
	res := map[string]phase{}
	for name, pid := range pids {
		end, err := read(pid)
		if err != nil {
			return nil, fmt.Errorf("%s exited during the run: %w", name, err)
		}
		sec := end.at.Sub(start[name].at).Seconds()
		res[name] = phase{
			cores:   float64(end.ticks-start[name].ticks) / clkTck / sec,
			wakeups: float64(end.ctxsw-start[name].ctxsw) / sec,
			peakRSS: max(peak[name], end.rssKiB),
		}
	}
	return res, nil
}

// inject writes rate lines/s into /dev/kmsg until ctx ends, 10 per open
// (the per-open rate limit); it returns the lines written.
func inject(ctx context.Context, rate int, written, xids *atomic.Int64) {
	const tick = 10 * time.Millisecond
	perTick := max(rate/int(time.Second/tick), 1)
	t := time.NewTicker(tick)
	defer t.Stop()
	n := 0
	sec := time.Now()
	xidDone := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(sec) >= time.Second {
			sec, xidDone = time.Now(), false
		}
		lines := make([]string, 0, perTick)
		for range perTick {
			n++
			if !xidDone {
				xidDone = true
				xids.Add(1)
				lines = append(lines, fmt.Sprintf("<3>NVRM: Xid (PCI:0000:fe:00): 13, pid=%d, name=frbench, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address\n", n))
				continue
			}
			lines = append(lines, fmt.Sprintf("<6>FRBENCH %d audit: type=1400 audit(1732960000.%03d:%d): apparmor=\"DENIED\" operation=\"open\" profile=\"cri-containerd.apparmor.d\" name=\"/proc/sys/kernel/x\"\n", n, n%1000, n))
		}
		for i := 0; i < len(lines); i += 10 {
			f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
			if err != nil {
				return
			}
			for _, l := range lines[i:min(i+10, len(lines))] {
				if _, err := f.WriteString(l); err == nil {
					written.Add(1)
				}
			}
			f.Close()
		}
	}
}

// controller is a fake controller that accepts reports and keeps counts.
type controller struct {
	mu       sync.Mutex
	reports  int
	findings map[string]int
	lost     uint64
}

func (c *controller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rep finding.Report
	_ = json.NewDecoder(io.LimitReader(r.Body, 8<<20)).Decode(&rep)
	c.mu.Lock()
	c.reports++
	for _, f := range rep.Findings {
		c.findings[f.Detector+"/"+f.GPUPCI] += f.Count
	}
	if rep.Heartbeat != nil {
		c.lost = rep.Heartbeat.LostRecords
	}
	c.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

func run(agentBin, npdBin, npdConfig, out string, agentArgs []string, idle, flood, settle time.Duration, rate int) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("create out dir: %w", err)
	}
	ctrl := &controller{findings: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: ctrl, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	pids := map[string]int{}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
	}()
	start := func(name string, args ...string) error {
		logf, err := os.Create(filepath.Join(out, name+".log"))
		if err != nil {
			return fmt.Errorf("create log: %w", err)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		procs = append(procs, cmd)
		pids[name] = cmd.Process.Pid
		return nil
	}
	args := append([]string{agentBin, "run", "--controller", "http://" + ln.Addr().String(),
		"--cluster", "bench", "--node", "bench-node", "--boot-id", "bench-boot", "--kmsg-seek-end",
		"--accept-user-facility", "--listen", ""}, agentArgs...)
	if err := start("fleetrepair-agent", args...); err != nil {
		return err
	}
	if npdBin != "" {
		if npdConfig == "" {
			if npdConfig, err = writeNPDConfig(out); err != nil {
				return err
			}
		}
		// NPD refuses to run without an exporter: keep its Prometheus one, on
		// a free loopback port (as deployed).
		pl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("find a free port: %w", err)
		}
		port := pl.Addr().(*net.TCPAddr).Port
		pl.Close()
		if err := start("node-problem-detector", npdBin, "--config.system-log-monitor="+npdConfig,
			"--enable-k8s-exporter=false", "--port=0", "--prometheus-address=127.0.0.1", "--prometheus-port="+strconv.Itoa(port),
			"--hostname-override=bench-node", "--logtostderr"); err != nil {
			return err
		}
	}
	time.Sleep(settle)
	fmt.Printf("idle %s, then %d lines/s into /dev/kmsg for %s\n", idle, rate, flood)
	idleRes, err := measure(pids, idle, nil)
	if err != nil {
		return err
	}
	var written, xids atomic.Int64
	floodRes, err := measure(pids, flood, func(ctx context.Context) { inject(ctx, rate, &written, &xids) })
	if err != nil {
		return err
	}
	time.Sleep(7 * time.Second) // let the agent flush its last batch
	// NPD's log is read below while it still runs: on SIGTERM it logs
	// "Kmsg channel closed" too.
	fmt.Printf("\n%-22s %12s %10s %12s   %12s %10s %12s\n", "process", "idle cores", "idle RSS", "idle wake/s", "flood cores", "flood RSS", "flood wake/s")
	for _, name := range []string{"fleetrepair-agent", "node-problem-detector"} {
		i, ok := idleRes[name]
		if !ok {
			continue
		}
		f := floodRes[name]
		fmt.Printf("%-22s %11.3f%% %7.1fMiB %12.1f   %11.2f%% %7.1fMiB %12.1f\n", name, 100*i.cores, float64(i.peakRSS)/1024, i.wakeups,
			100*f.cores, float64(f.peakRSS)/1024, f.wakeups)
	}
	got := float64(written.Load()) / flood.Seconds()
	fmt.Printf("\ninjected %d lines (%.0f lines/s achieved)\n", written.Load(), got)
	ctrl.mu.Lock()
	fmt.Printf("Xid lines injected: %d; agent: Xid findings %d (%d reports), lost kernel records %d (counted, reported in the heartbeat)\n",
		xids.Load(), ctrl.findings["xid/0000:fe:00.0"], ctrl.reports, ctrl.lost)
	ctrl.mu.Unlock()
	if npdBin != "" {
		// NPD logs each event once ("New status generated ... Reason:NVRMXid")
		// and "Kmsg channel closed" when its reader stops (go-kmsg-parser
		// closes its channel on the EPIPE of an overrun).
		b, _ := os.ReadFile(filepath.Join(out, "node-problem-detector.log"))
		log := string(b)
		fmt.Printf("node-problem-detector: NVRMXid events %d", strings.Count(log, "Reason:NVRMXid Message"))
		if i := strings.Index(log, "Kmsg channel closed"); i >= 0 {
			line := log[max(strings.LastIndexByte(log[:i], '\n'), 0):i]
			fmt.Printf("; its kernel log reader STOPPED during the run (%s): its flood figures cover a partial run", strings.TrimSpace(line))
		}
		fmt.Println()
	}
	if n, ok := floodRes["node-problem-detector"]; ok && n.cores > 0 {
		a := floodRes["fleetrepair-agent"]
		fmt.Printf("flood CPU ratio agent/NPD: %.2f; idle RSS ratio: %.2f\n", a.cores/n.cores,
			float64(idleRes["fleetrepair-agent"].peakRSS)/float64(idleRes["node-problem-detector"].peakRSS))
	}
	return nil
}

// writeNPDConfig copies NPD's shipped kernel-monitor.json and adds a rule
// for NVRM Xid lines, so both programs match the same line.
func writeNPDConfig(out string) (string, error) {
	gomodcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	src := filepath.Join(strings.TrimSpace(string(gomodcache)), "k8s.io/node-problem-detector@v1.34.0/config/kernel-monitor.json")
	b, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("read NPD kernel monitor config (go mod download k8s.io/node-problem-detector@v1.34.0): %w", err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return "", fmt.Errorf("parse NPD config: %w", err)
	}
	rules, _ := cfg["rules"].([]any)
	cfg["rules"] = append(rules, map[string]any{"type": "temporary", "reason": "NVRMXid", "pattern": `NVRM: Xid \(PCI:[0-9a-fA-F:]+\): \d+,.*`})
	cfg["lookback"] = "0s"
	b, err = json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", errors.New("encode NPD config")
	}
	p, _ := filepath.Abs(filepath.Join(out, "kernel-monitor.json"))
	return p, os.WriteFile(p, b, 0o644)
}
