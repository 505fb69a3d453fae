package uplink

import (
	"log/slog"
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
