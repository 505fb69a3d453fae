package uplink

import (
	"log/slog"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkEnqueue measures the cost Enqueue adds to the kernel-log reader.
//
//   - room: the queue has room; every DefaultBatchSize findings a take drains
//     them, as the sender would, so the cost of take is included, amortised
//     (take allocates the batch: about 240 B per finding).
//   - full: every Enqueue drops the oldest non-critical finding.
//   - critical: every Enqueue also signals the sender.
//   - parallel: several readers on a full queue (mutex contention).
func BenchmarkEnqueue(b *testing.B) {
	newUplink := func(b *testing.B, size int) *Uplink {
		b.Helper()
		u, err := New(Config{URL: "http://127.0.0.1:9", Cluster: "c1", Node: "node-a1", BootID: "boot-1", QueueSize: size,
			Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		return u
	}
	fill := func(u *Uplink) {
		for range u.cfg.QueueSize {
			u.Enqueue(norm("old"))
		}
	}

	b.Run("room", func(b *testing.B) {
		u := newUplink(b, DefaultQueueSize)
		f := norm("f")
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			u.Enqueue(f)
			if i++; i == DefaultBatchSize {
				u.q.take(DefaultBatchSize)
				i = 0
			}
		}
	})
	b.Run("full", func(b *testing.B) {
		u := newUplink(b, DefaultQueueSize)
		fill(u)
		f := norm("f")
		b.ReportAllocs()
		for b.Loop() {
			u.Enqueue(f)
		}
	})
	b.Run("critical", func(b *testing.B) {
		u := newUplink(b, DefaultQueueSize)
		fill(u)
		f := crit("c")
		b.ReportAllocs()
		for b.Loop() {
			u.Enqueue(f)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		u := newUplink(b, DefaultQueueSize)
		fill(u)
		f := norm("f")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				u.Enqueue(f)
			}
		})
	})
}

// BenchmarkNew measures building one uplink without a spool, as the load
// harness does once per simulated node: allocations per uplink and time.
//   - own: the uplink builds its own metrics and registers nothing.
//   - registered: its own metrics, registered on a fresh registry (the agent).
//   - shared: one NewMetrics set for all (Config.Metrics, the load harness).
//
// retained-B/uplink is the live heap per uplink with 10,000 of them kept.
func BenchmarkNew(b *testing.B) {
	cfg := Config{URL: "http://127.0.0.1:9", Cluster: "c1", Node: "node-a1", BootID: "boot-1",
		Logger: slog.New(slog.DiscardHandler)}
	b.Run("own", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := New(cfg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("registered", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := cfg
			c.Registerer = prometheus.NewRegistry()
			if _, err := New(c); err != nil {
				b.Fatal(err)
			}
		}
	})
	shared, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.Run("shared", func(b *testing.B) {
		c := cfg
		c.Metrics = shared
		b.ReportAllocs()
		for b.Loop() {
			if _, err := New(c); err != nil {
				b.Fatal(err)
			}
		}
	})
	retained := func(b *testing.B, c Config) {
		const n = 10000
		keep := make([]*Uplink, n)
		var before, after runtime.MemStats
		for b.Loop() {
			clear(keep)
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i := range keep {
				u, err := New(c)
				if err != nil {
					b.Fatal(err)
				}
				keep[i] = u
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "retained-B/uplink")
		runtime.KeepAlive(keep)
	}
	b.Run("own-retained", func(b *testing.B) { retained(b, cfg) })
	b.Run("shared-retained", func(b *testing.B) {
		c := cfg
		c.Metrics = shared
		retained(b, c)
	})
}
