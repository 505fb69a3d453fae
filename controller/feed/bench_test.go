package feed

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// idleSource is a Source with nothing stored: the benchmark drives
// deliver directly, without the database.
type idleSource struct{}

func (idleSource) EventsAfter(context.Context, int64, int) (store.EventBatch, error) {
	return store.EventBatch{}, nil
}
func (idleSource) EventBounds(context.Context) (int64, int64, error) { return 0, 0, nil }
func (idleSource) ListenEvents(ctx context.Context, _ func(), _ func(time.Time), _ func(error)) error {
	<-ctx.Done()
	return nil
}
func (idleSource) DeleteEventsBefore(context.Context, time.Time) (int64, error) { return 0, nil }

// BenchmarkDeliver fans batches of 100 events out to n subscribers and
// waits until each has drained the batch (the Hub's cost per event and
// stream with the readers' wake-ups, without the database read and the
// network write). dropped must stay 0: a drop would make later batches
// free.
//
//	go test -run '^$' -bench BenchmarkDeliver -benchmem ./controller/feed/
func BenchmarkDeliver(b *testing.B) {
	data := json.RawMessage(`{"repairId":7,"cluster":"c1","node":"gpu-1","from":"awaiting_approval","to":"approved","actor":"user:alice"}`)
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("subscribers=%d", n), func(b *testing.B) {
			h, err := New(Config{Source: idleSource{}, MaxSubscribers: n})
			if err != nil {
				b.Fatal(err)
			}
			h.ready = true
			var drained, done sync.WaitGroup // drained: one Done per subscriber and batch
			for range n {
				s, err := h.Subscribe(context.Background(), 0, false)
				if err != nil {
					b.Fatal(err)
				}
				done.Add(1)
				go func() {
					defer done.Done()
					got := 0
					for range s.C {
						if got++; got%100 == 0 {
							drained.Done()
						}
					}
				}()
			}
			batch := store.EventBatch{Events: make([]store.Event, 100), XMin: 1, XMax: 1}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range batch.Events {
					batch.Events[j] = store.Event{ID: int64(i*100 + j + 1), Type: store.EventRepair, Cluster: "c1", Node: "gpu-1", Data: data}
				}
				drained.Add(n)
				h.deliver(batch)
				drained.Wait()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "events/s")
			dropped := n - h.Subscribers()
			b.ReportMetric(float64(dropped), "dropped")
			h.closeAll()
			done.Wait()
		})
	}
}
