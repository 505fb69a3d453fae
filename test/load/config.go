package load

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Bounds of a run, checked before anything starts (Config.validate).
const (
	// MaxClusters is the most clusters one run starts: 100 kube-apiservers
	// with their etcds are about 25 GiB at APIServerMemory each.
	MaxClusters = 100
	// MaxZones is the most zones: they are named zone-a to zone-z.
	MaxZones = 26
	// MaxNodesPerCluster is the most Nodes one simulated cluster holds:
	// ten times the 10,000 the harness has run in one cluster
	// (docs/scale.md, "Figures").
	MaxNodesPerCluster = 100_000
	// MaxNodes is the most nodes one run simulates, over every cluster:
	// docs/scale.md "At 1,000,000 nodes, on paper" is the scale the
	// design is sized for; one harness process would not hold more agents.
	MaxNodes = 1_000_000
	// APIServerMemory is the memory one simulated cluster (kube-apiserver
	// and etcd, idle, GOGC 25) takes: about 215 MiB of kube-apiserver RSS
	// measured (Config.SmallAPIServerGOGC), 250 MiB with its etcd
	// (docs/scale.md, "The fleet scenario").
	APIServerMemory = 250 << 20
)

// validate returns every bad field of c, its defaults applied, as one
// error naming only the bad values ("load config: replicas 3: want 1 or
// 2; zones 30: want 2 to 26"), or nil.
func (c Config) validate() error {
	var bad []string
	add := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if c.Nodes < 1 || c.Nodes > MaxNodes {
		add("nodes %d: want 1 to %d", c.Nodes, MaxNodes)
	}
	if c.Clusters < 1 || c.Clusters > MaxClusters {
		add("clusters %d: want 1 to %d", c.Clusters, MaxClusters)
	}
	if c.Zones < 2 || c.Zones > MaxZones {
		add("zones %d: want 2 to %d", c.Zones, MaxZones)
	}
	if c.Replicas < 1 || c.Replicas > 2 {
		add("replicas %d: want 1 or 2", c.Replicas)
	}
	if c.KillLeader && c.Replicas != 2 {
		add("killLeader with replicas %d: needs 2 replicas", c.Replicas)
	}
	if c.WaveSpread > 0 && c.KillAt > c.WaveSpread {
		add("kill-at %s: want 0 (with the first failing report) to %s (the wave's spread)", c.KillAt, c.WaveSpread)
	}
	if c.KillLeader && c.Clusters > 1 {
		add("killLeader with clusters %d: the fleet scenario kills no replica", c.Clusters)
	}
	if c.Workers < 1 {
		add("workers %d: want 1 or more", c.Workers)
	}
	if c.CreateWorkers < 1 {
		add("createWorkers %d: want 1 or more", c.CreateWorkers)
	}
	if c.DBPoolConns < 0 {
		add("db-pool %d: want 0 (the controller's default) or more", c.DBPoolConns)
	}
	if c.SmallAPIServerGOGC < 1 {
		add("smallAPIServerGOGC %d: want 1 or more", c.SmallAPIServerGOGC)
	}
	if c.SmallAPIServerNice < 1 || c.SmallAPIServerNice > 19 {
		add("smallAPIServerNice %d: want 1 to 19", c.SmallAPIServerNice)
	}
	if c.Background < 0 {
		add("background %g findings/s: want 0 or more", c.Background)
	}
	if c.WaveZoneShare <= 0 || c.WaveZoneShare >= 1 {
		add("waveZoneShare %g: want more than 0, less than 1", c.WaveZoneShare)
	}
	if c.WaveShare <= 0 || c.WaveShare > 1 {
		add("waveShare %g: want more than 0, at most 1", c.WaveShare)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"heartbeat", c.Heartbeat}, {"flush", c.Flush}, {"steady", c.Steady}, {"waveSpread", c.WaveSpread},
		{"waveMax", c.WaveMax}, {"toleration", c.Toleration}, {"resync", c.Resync}, {"drain", c.Drain},
		{"profileFor", c.ProfileFor}, {"heapProfileEvery", c.HeapProfileEvery}, {"agentRamp", c.AgentRamp}} {
		if d.v <= 0 {
			add("%s %s: want more than 0", d.name, d.v)
		}
	}
	if c.LeaseDuration != 0 {
		if c.Replicas != 2 {
			add("lease-duration %s with replicas %d: only 2 replicas elect a leader", c.LeaseDuration, c.Replicas)
		} else if err := leaseTimings(c.LeaseDuration).CheckTimings(); err != nil {
			var te *runner.TimingError
			if errors.As(err, &te) && te.Timing == "lease duration" {
				add("lease-duration %s: want %s, or 0 for the controller's default", c.LeaseDuration, te.Want)
			} else {
				add("lease-duration %s: %v", c.LeaseDuration, err)
			}
		}
	}
	if c.Nodes >= 1 && c.Clusters >= 1 && c.Clusters <= MaxClusters {
		bad = append(bad, c.clusterShares()...)
	}
	if len(bad) == 0 {
		return nil
	}
	return &ConfigError{Problems: bad}
}

// clusterShares checks how the nodes fall into the clusters: with one
// cluster the wave needs a wave node and a lone node outside the wave
// zone; with more, the first cluster's share and every other cluster's
// must each be 1 to MaxNodesPerCluster.
func (c Config) clusterShares() []string {
	var bad []string
	if c.Clusters == 1 {
		inWave := int(float64(c.Nodes) * c.WaveZoneShare)
		if c.Nodes > MaxNodesPerCluster {
			bad = append(bad, fmt.Sprintf("nodes %d in 1 cluster: want at most %d per cluster", c.Nodes, MaxNodesPerCluster))
		}
		if int(float64(c.Nodes)*c.WaveZoneShare*c.WaveShare) < 1 || c.Nodes-inWave < 1 {
			bad = append(bad, fmt.Sprintf("nodes %d: too few for the wave (a failing node in the wave zone and a lone one outside it)", c.Nodes))
		}
		return bad
	}
	others := c.Nodes - c.FirstClusterNodes
	if c.FirstClusterNodes < 1 || c.FirstClusterNodes > MaxNodesPerCluster || others < c.Clusters-1 {
		bad = append(bad, fmt.Sprintf("first-cluster-nodes %d of %d nodes: want 1 to %d, leaving a node for each of the %d other clusters",
			c.FirstClusterNodes, c.Nodes, min(MaxNodesPerCluster, c.Nodes-(c.Clusters-1)), c.Clusters-1))
	} else if per := (others + c.Clusters - 2) / (c.Clusters - 1); per > MaxNodesPerCluster {
		bad = append(bad, fmt.Sprintf("nodes %d in %d clusters: %d in each after the first, want at most %d per cluster",
			c.Nodes, c.Clusters, per, MaxNodesPerCluster))
	}
	return bad
}

// checkMemory refuses a cluster count whose API servers and etcds
// (APIServerMemory each) do not fit in available bytes of memory.
func checkMemory(clusters int, available int64) error {
	need := int64(clusters) * APIServerMemory
	if need > available {
		return &ConfigError{Problems: []string{fmt.Sprintf("clusters %d: need about %d MiB for their API servers and etcds (%d MiB each), the machine has %d MiB available",
			clusters, need>>20, APIServerMemory>>20, available>>20)}}
	}
	return nil
}

// memAvailable is MemAvailable of /proc/meminfo, bytes.
func memAvailable() (int64, error) { return procKB("/proc/meminfo", "MemAvailable") }

// checkConfig applies cfg's defaults and validates it, the memory of its
// API servers included: what Run does before it starts anything.
func checkConfig(cfg *Config) error {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	avail, err := memAvailable()
	if err != nil {
		return fmt.Errorf("load config: %w", err)
	}
	return checkMemory(cfg.Clusters, avail)
}

var setLoggerOnce sync.Once

// setControllerRuntimeLogger gives controller-runtime, which the harness
// uses through test/envtest and its clients, a logger: its errors (an API
// server that did not start, with envtest's retries) to stderr, the rest
// dropped. Without one, controller-runtime prints "log.SetLogger(...) was
// never called" with a goroutine stack 30 s into the run, which reads as a
// crash (sigs.k8s.io/controller-runtime pkg/log, eventuallyFulfillRoot).
func setControllerRuntimeLogger() {
	setLoggerOnce.Do(func() {
		ctrllog.SetLogger(errorLogger(os.Stderr))
	})
}

// errorLogger is a logr.Logger that writes errors to w as slog text lines
// and drops everything else.
func errorLogger(w io.Writer) logr.Logger {
	return logr.FromSlogHandler(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelError}))
}
