package pgtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

func TestMain(m *testing.M) { Main(m) }

func TestDSNIsFreshAndMigrated(t *testing.T) {
	for i := range 3 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, err := store.Open(ctx, DSN(t))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// Migrated: the tables exist. Fresh: nothing from sibling tests.
			if _, err := s.GetCluster(ctx, "c"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("GetCluster on a fresh database: %v, want ErrNotFound", err)
			}
			if _, err := s.SetClusterBudget(ctx, "c", 1, 1, time.Now()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestEmptyDSNHasNoSchema(t *testing.T) {
	ctx := context.Background()
	cur, latest, err := store.SchemaVersion(ctx, EmptyDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if cur != 0 || latest < 1 {
		t.Fatalf("SchemaVersion of an empty database = %d, %d; want 0 and >= 1", cur, latest)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:p@h:5432/app?sslmode=disable", "postgres://u:p@h:5432/x?sslmode=disable"},
		{"postgresql://h/app", "postgresql://h/x"},
		{"host=h user=u dbname=app", "host=h user=u dbname=app dbname='x'"},
	} {
		got, err := WithDatabase(tc.in, "x")
		if err != nil || got != tc.want {
			t.Errorf("WithDatabase(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
