package load

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/config"
)

// defaultFlags are the -load.* flags' defaults.
func defaultFlags() flagValues {
	return flagValues{nodes: 1000, zones: 4, clusters: 1, replicas: 2, workers: config.DefaultWorkers, dbPool: 32,
		steady: time.Minute, heartbeat: 30 * time.Second, toleration: 30 * time.Second, pgOutage: time.Minute, heapEvery: 5 * time.Minute, killAt: 1500 * time.Millisecond}
}

func TestFlagDefaultsMatchTheFlags(t *testing.T) {
	if got, want := currentFlags(), defaultFlags(); got != want {
		t.Fatalf("flag defaults %+v, want %+v", got, want)
	}
	if *benchFlags.workers != config.DefaultWorkers {
		t.Fatalf("-load.workers defaults to %d, the controller's --workers to %d", *benchFlags.workers, config.DefaultWorkers)
	}
}

func TestFlagConfig(t *testing.T) {
	cfg, err := flagConfig(defaultFlags(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Nodes != 1000 || cfg.Replicas != 2 || !cfg.KillLeader || cfg.Workers != config.DefaultWorkers || cfg.PGOutage != time.Minute || cfg.DBPoolConns != 32 {
		t.Fatalf("config %+v", cfg)
	}
	for _, tc := range []struct {
		name string
		edit func(*flagValues)
		want string // the whole message
	}{
		{"nodes 0", func(f *flagValues) { f.nodes = 0 }, "load config: nodes 0: want 1 or more"},
		{"nodes negative", func(f *flagValues) { f.nodes = -5 }, "load config: nodes -5: want 1 to 1000000"},
		{"replicas 3", func(f *flagValues) { f.replicas = 3 }, "load config: replicas 3: want 1 or 2"},
		{"replicas 0", func(f *flagValues) { f.replicas = 0 }, "load config: replicas 0: want 1 or 2"},
		{"workers 0", func(f *flagValues) { f.workers = 0 }, "load config: workers 0: want 1 or more"},
		{"workers negative", func(f *flagValues) { f.workers = -1 }, "load config: workers -1: want 1 or more"},
		{"steady 0", func(f *flagValues) { f.steady = 0 }, "load config: steady 0s: want more than 0"},
		{"heartbeat negative", func(f *flagValues) { f.heartbeat = -time.Second }, "load config: heartbeat -1s: want more than 0"},
		{"toleration 0", func(f *flagValues) { f.toleration = 0 }, "load config: toleration 0s: want more than 0"},
		{"zones 1", func(f *flagValues) { f.zones = 1 }, "load config: zones 1: want 2 to 26"},
		{"zones 27", func(f *flagValues) { f.zones = 27 }, "load config: zones 27: want 2 to 26"},
		{"clusters 0", func(f *flagValues) { f.clusters = 0 }, "load config: clusters 0: want 1 or more"},
		{"clusters over the cap", func(f *flagValues) { f.clusters = 101 }, "load config: clusters 101: want 1 to 100"},
		{"db-pool negative", func(f *flagValues) { f.dbPool = -1 }, "load config: db-pool -1: want 0 (the controller's default) or more"},
		{"heap-every negative", func(f *flagValues) { f.heapEvery = -time.Second }, "load config: heap-every -1s: want 0 (never) or more"},
		{"agent-ramp negative", func(f *flagValues) { f.agentRamp = -time.Minute }, "load config: agent-ramp -1m0s: want 0 (scaled with the nodes) or more"},
		{"lease with one replica", func(f *flagValues) { f.replicas, f.lease = 1, 5*time.Second },
			"load config: lease-duration 5s with replicas 1: only 2 replicas elect a leader"},
		{"lease not whole seconds", func(f *flagValues) { f.lease = 2500 * time.Millisecond },
			"load config: lease-duration 2.5s: want a whole number of seconds, at least 1s (the Lease stores whole seconds), or 0 for the controller's default"},
		{"first cluster without clusters", func(f *flagValues) { f.firstNodes = 10 },
			"load config: first-cluster-nodes 10 with clusters 1: only the fleet scenario (clusters > 1) has a first cluster"},
		{"too few nodes for the wave", func(f *flagValues) { f.nodes = 3 },
			"load config: nodes 3: too few for the wave (a failing node in the wave zone and a lone one outside it)"},
		{"too many nodes in one cluster", func(f *flagValues) { f.nodes = 200_000 },
			"load config: nodes 200000 in 1 cluster: want at most 100000 per cluster"},
		{"a cluster without a node", func(f *flagValues) { f.clusters, f.nodes, f.replicas, f.firstNodes = 3, 10, 1, 9 },
			"load config: first-cluster-nodes 9 of 10 nodes: want 1 to 8, leaving a node for each of the 2 other clusters"},
		{"two bad values", func(f *flagValues) { f.replicas, f.zones = 3, 1 }, "load config: zones 1: want 2 to 26; replicas 3: want 1 or 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := defaultFlags()
			tc.edit(&f)
			_, err := flagConfig(f, nil)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestFlagConfigZeroMeansNone(t *testing.T) {
	f := defaultFlags()
	f.pgOutage, f.heapEvery, f.dbPool = 0, 0, 0
	cfg, err := flagConfig(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PGOutage >= 0 || cfg.HeapProfileDir != "" || cfg.DBPoolConns != 0 {
		t.Fatalf("pg-outage 0 gave PGOutage %s, heap-every 0 gave folder %q, db-pool 0 gave %d", cfg.PGOutage, cfg.HeapProfileDir, cfg.DBPoolConns)
	}
	f.nodes = 7 // the fewest the wave runs with (docs/scale.md, "Commands")
	if _, err := flagConfig(f, nil); err != nil {
		t.Fatalf("7 nodes: %v", err)
	}
	f.pgOutage = -time.Second // docs/scale.md's LOAD_PG_OUTAGE=-1s
	if cfg, err = flagConfig(f, nil); err != nil || cfg.PGOutage >= 0 {
		t.Fatalf("pg-outage -1s: PGOutage %s, error %v", cfg.PGOutage, err)
	}
}

func TestFlagConfigFleet(t *testing.T) {
	f := defaultFlags()
	f.clusters, f.replicas, f.nodes = 3, 1, 600
	cfg, err := flagConfig(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KillLeader || cfg.FirstClusterNodes != 300 {
		t.Fatalf("fleet config: killLeader %v, first cluster %d nodes", cfg.KillLeader, cfg.FirstClusterNodes)
	}
	f.nodes = 300_000 // 10,000 in the first, 145,000 in each of the other two
	if _, err := flagConfig(f, nil); err == nil || !strings.Contains(err.Error(), "145000 in each after the first, want at most 100000 per cluster") {
		t.Fatalf("300,000 nodes in 3 clusters: %v", err)
	}
}

func TestFlagConfigAgentRamp(t *testing.T) {
	for _, tc := range []struct {
		nodes, clusters int
		heartbeat, ramp time.Duration
		want            time.Duration
	}{
		{1000, 1, 30 * time.Second, 0, 30 * time.Second},                   // one heartbeat, as before the ramp
		{10000, 1, 30 * time.Second, 0, 30 * time.Second},                  // 3 ms x 10,000 is one heartbeat
		{20000, 10, 30 * time.Second, 0, time.Minute},                      // 3 ms per agent
		{100000, 10, 30 * time.Second, 0, 5 * time.Minute},                 // 100,000 agents
		{20000, 10, 6 * time.Second, 0, time.Minute},                       // a short heartbeat does not shorten it
		{200, 1, 5 * time.Minute, 0, 5 * time.Minute},                      // a long heartbeat lengthens it
		{100000, 10, 30 * time.Second, 20 * time.Minute, 20 * time.Minute}, // set: kept
	} {
		f := defaultFlags()
		f.nodes, f.clusters, f.heartbeat, f.agentRamp = tc.nodes, tc.clusters, tc.heartbeat, tc.ramp
		if tc.clusters > 1 {
			f.replicas = 1
		}
		cfg, err := flagConfig(f, nil)
		if err != nil {
			t.Fatalf("%d nodes: %v", tc.nodes, err)
		}
		if cfg.AgentRamp != tc.want {
			t.Errorf("%d nodes, heartbeat %s, -load.agent-ramp %s: AgentRamp %s, want %s", tc.nodes, tc.heartbeat, tc.ramp, cfg.AgentRamp, tc.want)
		}
	}
}

func TestRampDelay(t *testing.T) {
	const n, ramp = 1000, 5 * time.Minute
	prev := time.Duration(-1)
	for i := range n {
		d := rampDelay(i, n, ramp)
		if d <= prev || d < 0 || d >= ramp {
			t.Fatalf("agent %d of %d starts at %s after %s: want increasing, within [0, %s)", i, n, d, prev, ramp)
		}
		// Evenly: agent i at i*ramp/n, to the nanosecond's rounding.
		if want := ramp / n * time.Duration(i); d-want > time.Microsecond || want-d > time.Microsecond {
			t.Fatalf("agent %d starts at %s, want %s", i, d, want)
		}
		prev = d
	}
	if got := rampDelay(0, n, ramp); got != 0 {
		t.Errorf("first agent at %s, want 0", got)
	}
	if got := rampDelay(n-1, n, ramp); got != ramp-ramp/n {
		t.Errorf("last agent at %s, want %s", got, ramp-ramp/n)
	}
	// 100,000 agents over an hour: no overflow, the last within the ramp.
	if got := rampDelay(99_999, 100_000, time.Hour); got <= 59*time.Minute || got >= time.Hour {
		t.Errorf("agent 99,999 of 100,000 over 1h at %s", got)
	}
	for _, tc := range []struct {
		i, n int
		ramp time.Duration
		want time.Duration
	}{{0, 1, time.Minute, 0}, {5, 1, time.Minute, 0}, {-1, 10, time.Minute, 0}, {3, 10, 0, 0}, {20, 10, time.Minute, 54 * time.Second}} {
		if got := rampDelay(tc.i, tc.n, tc.ramp); got != tc.want {
			t.Errorf("rampDelay(%d, %d, %s) = %s, want %s", tc.i, tc.n, tc.ramp, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Nodes: 200}
	ok.defaults()
	if err := ok.validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.KillLeader, c.Replicas = true, 1 }, "load config: killLeader with replicas 1: needs 2 replicas"},
		{func(c *Config) { c.WaveSpread = -time.Second }, "load config: waveSpread -1s: want more than 0"},
		{func(c *Config) { c.WaveShare = 1.5 }, "load config: waveShare 1.5: want more than 0, at most 1"},
		{func(c *Config) { c.CreateWorkers = -2 }, "load config: createWorkers -2: want 1 or more"},
		{func(c *Config) { c.AgentRamp = -time.Second }, "load config: agentRamp -1s: want more than 0"},
	} {
		c := ok
		tc.edit(&c)
		if err := c.validate(); err == nil || err.Error() != tc.want {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}

func TestCheckMemory(t *testing.T) {
	if err := checkMemory(50, 13<<30); err != nil {
		t.Fatalf("50 clusters in 13 GiB: %v", err)
	}
	err := checkMemory(50, 8<<30)
	want := "load config: clusters 50: need about 12500 MiB for their API servers and etcds (250 MiB each), the machine has 8192 MiB available"
	if err == nil || err.Error() != want {
		t.Fatalf("50 clusters in 8 GiB: %v, want %q", err, want)
	}
	if _, err := memAvailable(); err != nil {
		t.Fatal(err)
	}
}

func TestErrorLogger(t *testing.T) {
	var b strings.Builder
	l := errorLogger(&b)
	l.Info("routine", "k", 1)
	l.V(1).Info("debug")
	if b.Len() != 0 {
		t.Fatalf("info lines written: %q", b.String())
	}
	l.Error(errors.New("timeout waiting for process kube-apiserver to start"), "unable to start the controlplane", "tries", 1)
	if got := b.String(); !strings.Contains(got, "unable to start the controlplane") || !strings.Contains(got, "kube-apiserver to start") {
		t.Fatalf("error line %q", got)
	}
}

func TestParseLoadAvg(t *testing.T) {
	v, err := parseLoadAvg([]byte("32.24 47.88 37.20 24/1101 15837\n"))
	if err != nil || v != 32.24 {
		t.Fatalf("parseLoadAvg: %v, %v", v, err)
	}
	if _, err := parseLoadAvg([]byte("")); err == nil {
		t.Fatal("parseLoadAvg of an empty file: no error")
	}
	if _, err := loadAverage(); err != nil {
		t.Fatal(err)
	}
}

func TestRelativeTo(t *testing.T) {
	if got := relativeTo(-2604*time.Millisecond, "the last one was acknowledged"); got != "2.604s before the last one was acknowledged" {
		t.Fatalf("negative: %q", got)
	}
	if got := relativeTo(1222*time.Millisecond, "the last one was acknowledged"); got != "1.222s after the last one was acknowledged" {
		t.Fatalf("positive: %q", got)
	}
}

func TestWriteTable(t *testing.T) {
	r := &Result{Config: Config{Nodes: 1000, Zones: 4, Clusters: 1, Replicas: 2, Workers: 16},
		Phases:     []Phase{{Name: "steady", Duration: time.Minute, Accepted: 600, LoadStart: 1.5, LoadEnd: 2.25}},
		WaveCohort: "zone=zone-a", TripAfter: 1222 * time.Millisecond, TripLast: -2604 * time.Millisecond}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"load avg start/end", "1.5/2.2", "tripped 1.222s after the first failing report, 2.604s before the last one was acknowledged",
		"no answer: POSTs that got no HTTP answer", "ctrl cores: CPU of every controller replica together", "ctrl RSS: the largest RSS of one replica",
		"the controller's default, 32 connections"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestStopOnSignal(t *testing.T) {
	var stops stopList
	var order []string
	stops.add(func() { order = append(order, "postgres") })
	stops.add(func() { order = append(order, "api server") })
	stops.add(func() { order = append(order, "controller") })
	exited := make(chan int, 1)
	var logged []string
	cancel := stopOnSignal(&stops, func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }, func(code int) { exited <- code })
	defer cancel()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exited:
		if code != 128+int(syscall.SIGTERM) {
			t.Errorf("exit code %d, want %d", code, 128+int(syscall.SIGTERM))
		}
	case <-time.After(time.Minute):
		t.Fatal("no exit within a minute of SIGTERM")
	}
	if got := strings.Join(order, ", "); got != "controller, api server, postgres" {
		t.Errorf("stopped %s, want the controller, the API server, then PostgreSQL", got)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "received terminated") {
		t.Errorf("logged %q", logged)
	}
	stops.run() // the test's cleanups find nothing left to run twice
	if len(order) != 3 {
		t.Errorf("stop functions ran again: %v", order)
	}
}

// TestFlagConfigLease: -load.lease-duration reaches Config and the
// replicas' flags, with timings the controller accepts (a 15 s Lease gives
// client-go's defaults).
func TestFlagConfigLease(t *testing.T) {
	f := defaultFlags()
	f.lease = 5 * time.Second
	cfg, err := flagConfig(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LeaseDuration != 5*time.Second {
		t.Fatalf("LeaseDuration %s, want 5s", cfg.LeaseDuration)
	}
	le := leaseTimings(15 * time.Second)
	if le.RenewDeadline != 10*time.Second || le.RetryPeriod != 2*time.Second {
		t.Fatalf("leaseTimings(15s) = %s, %s; want client-go's 10s, 2s", le.RenewDeadline, le.RetryPeriod)
	}
	for _, s := range []int{1, 2, 5, 7, 60} {
		if err := leaseTimings(time.Duration(s) * time.Second).CheckTimings(); err != nil {
			t.Errorf("leaseTimings(%ds): %v", s, err)
		}
	}
}
