package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is the fake clock's start; every test steps from it.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// open returns a Store on a fresh, migrated database of its own.
func open(t testing.TB) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
