// Package pgtest gives each test its own fresh PostgreSQL database with the
// controller's schema migrated, on a real server (source.go):
//
//   - $DATABASE_URL when set (the role must be allowed to CREATE DATABASE);
//   - else, when a Docker engine answers, one PostgreSQL container per test
//     binary from testcontainers-go's postgres module;
//   - else one throwaway server per test binary from the local PostgreSQL
//     server binaries (test/pgtemp).
//
// The container and the throwaway server start on first use and are
// stopped by Main. Without any of the three the test fails with a message
// naming them and why each failed. The schema is migrated
// once per test binary into a template database; each test gets a copy
// (CREATE DATABASE ... TEMPLATE, tens of milliseconds), dropped when the test
// ends. Packages using DSN call Main from their TestMain (without it the
// throwaway server still dies with the test binary, but leaves its temporary
// directory behind):
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// EnvDatabaseURL names the variable that points the tests at an existing
// server instead of a throwaway one.
const EnvDatabaseURL = "DATABASE_URL"

var (
	once     sync.Once
	initErr  error
	running  server // the chosen source, started
	adminDSN string // where CREATE/DROP DATABASE run
	template string // migrated template database ("" until first DSN)
	prefix   string // per-process prefix of database names
	counter  atomic.Int64
	tmplOnce sync.Once
	tmplErr  error
)

// Main runs the tests and then stops the throwaway server (and drops the
// template database), and exits with the tests' status.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit, for a TestMain with cleanup of its own: it
// returns the tests' status.
func Run(m *testing.M) int {
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if running.stop != nil {
		return running.stop()
	}
	if template != "" && adminDSN != "" {
		return store.DropDatabase(ctx, adminDSN, template)
	}
	return nil
}

func setup() {
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix = "pgtest_" + strconv.Itoa(os.Getpid()) + "_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	src := defaultBackends
	src.getenv = os.Getenv
	running, initErr = src.pick(ctx)
	adminDSN = running.adminDSN
}

// Using returns where the tests' PostgreSQL comes from, starting it if
// needed.
func Using(t testing.TB) Source {
	t.Helper()
	AdminDSN(t)
	return running.source
}

// AdminDSN returns the DSN of the maintenance database of the test server
// (DATABASE_URL itself, or the throwaway server's "postgres" database),
// starting the server if needed. Tests should not write to it.
func AdminDSN(t testing.TB) string {
	t.Helper()
	once.Do(setup)
	if initErr != nil {
		t.Fatal(initErr)
	}
	return adminDSN
}

// EmptyDSN creates a fresh database without any schema, dropped when the test
// ends, and returns its DSN (for migration tests).
func EmptyDSN(t testing.TB) string {
	t.Helper()
	return create(t, AdminDSN(t), "")
}

// DSN creates a fresh database with the controller's schema migrated,
// dropped when the test ends, and returns its DSN. Safe to call from
// parallel tests.
func DSN(t testing.TB) string {
	t.Helper()
	admin := AdminDSN(t)
	tmplOnce.Do(func() {
		name := prefix + "_tmpl"
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := store.CreateDatabase(ctx, admin, name, ""); err != nil {
			tmplErr = fmt.Errorf("create template database: %w", err)
			return
		}
		template = name // dropped by Main from here on
		dsn, err := WithDatabase(admin, name)
		if err != nil {
			tmplErr = err
			return
		}
		if err := store.Migrate(ctx, dsn, store.MigrateUp, nil); err != nil {
			tmplErr = fmt.Errorf("migrate template database: %w", err)
		}
	})
	if tmplErr != nil {
		t.Fatal(tmplErr)
	}
	return create(t, admin, template)
}

func create(t testing.TB, admin, tmpl string) string {
	t.Helper()
	name := prefix + "_" + strconv.FormatInt(counter.Add(1), 10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := store.CreateDatabase(ctx, admin, name, tmpl); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := store.DropDatabase(ctx, admin, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	dsn, err := WithDatabase(admin, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// WithDatabase returns dsn (a postgres:// URL or a keyword/value string)
// pointing at database name instead.
func WithDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse %s: %w", EnvDatabaseURL, err)
		}
		u.Path = "/" + name
		q := u.Query()
		q.Del("dbname")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	// keyword/value: a later keyword overrides an earlier one.
	return strings.TrimSpace(dsn) + " dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(name) + "'", nil
}

// Store opens a store on a fresh migrated database (DSN) and closes it when
// the test ends; it fails the test when the database cannot be opened.
func Store(t testing.TB) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), DSN(t))
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(st.Close)
	return st
}
