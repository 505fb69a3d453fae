package uplink

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestRingMatchesSlice drives the ring with random pushes, pops and shrinks
// and compares it with a plain slice: order, wrap-around, growth and shrink.
func TestRingMatchesSlice(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var r ring[int]
	var model []int
	next := 0
	for step := range 200000 {
		switch op := rng.IntN(100); {
		case op < 55 || len(model) == 0: // grow a little faster than it drains
			r.push(next)
			model = append(model, next)
			next++
		case op < 99:
			if got, want := *r.peek(), model[0]; got != want {
				t.Fatalf("step %d: peek = %d, want %d", step, got, want)
			}
			if got, want := r.pop(), model[0]; got != want {
				t.Fatalf("step %d: pop = %d, want %d", step, got, want)
			}
			model = model[1:]
		default: // drain most of it, then shrink
			for len(model) > 3 {
				r.drop()
				model = model[1:]
			}
			r.shrink()
			if c := len(r.buf); c > ringKeepCap {
				t.Fatalf("step %d: capacity %d after shrink with %d elements, want <= %d", step, c, r.len(), ringKeepCap)
			}
		}
		if r.len() != len(model) {
			t.Fatalf("step %d: len = %d, want %d", step, r.len(), len(model))
		}
		if c := len(r.buf); c&(c-1) != 0 {
			t.Fatalf("step %d: capacity %d is not a power of two", step, c)
		}
	}
	var rest []int
	for r.len() > 0 {
		rest = append(rest, r.pop())
	}
	if !slices.Equal(rest, model) {
		t.Fatalf("remaining elements differ from the model")
	}
}

// TestTakePutsCriticalFirst checks the order of a partial take: critical
// findings first, the rest filled with the oldest non-critical ones, the
// batch in enqueue order.
func TestTakePutsCriticalFirst(t *testing.T) {
	t.Parallel()
	q := newMemQueue(100, func() time.Time { return t0 })
	for _, id := range []string{"n1", "c1", "n2", "n3", "c2", "n4"} {
		q.push(norm(id), id[0] == 'c')
	}
	tests := []struct {
		max  int
		want []string
	}{
		{1, []string{"c1"}},
		{2, []string{"n1", "c2"}},
		{2, []string{"n2", "n3"}},
		{10, []string{"n4"}},
		{10, nil},
	}
	for i, tt := range tests {
		var got []string
		for _, f := range q.take(tt.max) {
			got = append(got, f.ID)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("take #%d(%d) = %v, want %v", i+1, tt.max, got, tt.want)
		}
	}
	if st := q.state(); st.n != 0 || !st.since.IsZero() {
		t.Errorf("state after draining = %+v, want empty", st)
	}
}
