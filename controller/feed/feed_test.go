package feed_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/feed"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// decide appends one breaker decision (so one event) in its own transaction.
func decide(t *testing.T, st *store.Store, cohort string, at time.Time) {
	t.Helper()
	_, v, err := st.BreakerState(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SaveBreakerState(context.Background(), json.RawMessage(`{}`), v, []store.BreakerDecision{{At: at, Scope: "cohort",
		Cohort: cohort, From: "closed", To: "open", Cause: "test", Actor: "controller"}}, at); err != nil {
		t.Fatal(err)
	}
}

func cohortOf(t *testing.T, e store.Event) string {
	t.Helper()
	var m struct{ Cohort string }
	if err := json.Unmarshal(e.Data, &m); err != nil {
		t.Fatal(err)
	}
	return m.Cohort
}

func start(t *testing.T, cfg feed.Config) *feed.Hub {
	t.Helper()
	h, err := feed.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(30 * time.Second)
	for {
		sub, err := h.Subscribe(context.Background(), 0, false)
		if err == nil {
			sub.Close()
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub not ready: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gauge reads the value of a gauge or counter without labels.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			m := mf.Metric[0]
			if m.Gauge != nil {
				return m.Gauge.GetValue()
			}
			return m.Counter.GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// next waits (generously) for the subscription's next event.
func next(t *testing.T, s *feed.Subscription) store.Event {
	t.Helper()
	select {
	case e, ok := <-s.C:
		if !ok {
			t.Fatal("subscription closed")
		}
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30s")
	}
	return store.Event{}
}

// Two hubs on one database (two replicas): a change written through either
// reaches the subscribers of both, in id order; a reconnect with an old id
// replays what it missed; an id past the replay bound, or pruned, is a
// reset; a subscriber that does not read is dropped while the others go on.
func TestHubFansOutAcrossReplicasAndResumes(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	stA, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer stA.Close()
	stB, err := store.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer stB.Close()
	hubA := start(t, feed.Config{Source: stA, Poll: time.Hour}) // notifications alone
	reg := prometheus.NewRegistry()
	hubB := start(t, feed.Config{Source: stB, Poll: time.Hour, Replay: 3, Buffer: 2, Registerer: reg})

	onB, err := hubB.Subscribe(context.Background(), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer onB.Close()
	slow, err := hubB.Subscribe(context.Background(), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	onA, err := hubA.Subscribe(context.Background(), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer onA.Close()

	decide(t, stA, "zone=a", t0) // written on replica A
	first := next(t, onB)
	if cohortOf(t, first) != "zone=a" || first.Type != store.EventBreaker {
		t.Fatalf("replica B got %s %s, want A's breaker decision", first.Type, first.Data)
	}
	if e := next(t, onA); e.ID != first.ID {
		t.Fatalf("replica A got event %d, want %d", e.ID, first.ID)
	}
	var last store.Event
	for i := range 4 { // one at a time: onB reads each, slow reads none
		decide(t, stB, fmt.Sprintf("zone=b%d", i), t0.Add(time.Duration(i+1)*time.Second))
		e := next(t, onB)
		if want := fmt.Sprintf("zone=b%d", i); cohortOf(t, e) != want {
			t.Fatalf("event %d is %s, want %s (in order)", i, cohortOf(t, e), want)
		}
		last = e
	}
	// slow never read: first and b0 buffered, b1 dropped it.
	for range 2 {
		<-slow.C
	}
	if _, ok := <-slow.C; ok || !slow.Dropped() {
		t.Fatal("a subscriber that did not read was not dropped")
	}
	if hubB.Subscribers() != 1 {
		t.Errorf("hub B has %d subscribers, want 1 after the drop", hubB.Subscribers())
	}
	if v := gauge(t, reg, "fleetrepair_live_streams_dropped_total"); v != 1 {
		t.Errorf("fleetrepair_live_streams_dropped_total = %v, want 1", v)
	}
	if v := gauge(t, reg, "fleetrepair_live_streams"); v != 1 {
		t.Errorf("fleetrepair_live_streams = %v, want 1", v)
	}

	// Resume from first: the 4 after it are more than Replay (3): reset.
	re, err := hubB.Subscribe(context.Background(), first.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if !re.Reset || re.Position != last.ID || len(re.Replay) != 0 {
		t.Errorf("resume 4 behind with Replay 3: reset %v position %d (want %d) replay %d", re.Reset, re.Position, last.ID, len(re.Replay))
	}
	re.Close()
	// Resume 2 behind: replayed, then live.
	re, err = hubB.Subscribe(context.Background(), last.ID-2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer re.Close()
	if re.Reset || len(re.Replay) != 2 || re.Replay[0].ID != last.ID-1 || re.Replay[1].ID != last.ID {
		t.Fatalf("resume 2 behind: reset %v, replay %v", re.Reset, re.Replay)
	}
	decide(t, stA, "zone=live", t0.Add(time.Minute))
	if e := next(t, re); cohortOf(t, e) != "zone=live" {
		t.Errorf("after the replay got %s, want the live event", e.Data)
	}
	// Pruned: an id before the oldest kept is a reset.
	if _, err := stA.DeleteEventsBefore(context.Background(), t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	gone, err := hubB.Subscribe(context.Background(), first.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if !gone.Reset {
		t.Error("resume from a pruned id is not a reset")
	}
}

// An id taken by a transaction still open holds back the events after it
// (a stream never skips a committed event or reorders), and is delivered
// first once it commits; an id rolled back is skipped as soon as its
// transaction ends.
func TestHubWaitsForUncommittedIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	hub := start(t, feed.Config{Source: st, Poll: 20 * time.Millisecond, GapTimeout: time.Hour})
	sub, err := hub.Subscribe(ctx, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	insert := `INSERT INTO breaker_decisions (at, scope, cohort, from_phase, to_phase, cause, actor) VALUES ($1, 'cohort', $2, 'closed', 'open', 'test', 'controller')`
	for _, commit := range []bool{true, false} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, insert, t0, fmt.Sprintf("zone=slow-%v", commit)); err != nil {
			t.Fatal(err)
		}
		decide(t, st, fmt.Sprintf("zone=fast-%v", commit), t0) // a higher id, committed first
		select {
		case e := <-sub.C:
			t.Fatalf("delivered %s while a lower id was uncommitted", e.Data)
		case <-time.After(300 * time.Millisecond): // 15 polls
		}
		want := []string{fmt.Sprintf("zone=fast-%v", commit)}
		if commit {
			err = tx.Commit(ctx)
			want = append([]string{"zone=slow-true"}, want...)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if e := next(t, sub); cohortOf(t, e) != w {
				t.Fatalf("got %s, want %s", cohortOf(t, e), w)
			}
		}
	}
}
