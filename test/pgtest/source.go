package pgtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/fleetrepair/fleetrepair/test/pgtemp"
)

// Source is where the tests' PostgreSQL comes from, in the order pgtest
// tries them (docs/design.md, "Tests"; issue 12 item 8).
type Source string

const (
	// SourceURL: $DATABASE_URL, an existing server.
	SourceURL Source = "DATABASE_URL"
	// SourceContainer: a PostgreSQL container started by testcontainers-go's
	// postgres module, when a Docker engine answers.
	SourceContainer Source = "testcontainers"
	// SourceInitdb: a throwaway server made by the local initdb/pg_ctl
	// (test/pgtemp).
	SourceInitdb Source = "initdb"
)

// ContainerImage is the PostgreSQL image of SourceContainer: the major
// version the local binaries and the deployment use.
const ContainerImage = "postgres:15-alpine"

// dockerProbeTimeout bounds the question "does a Docker engine answer?".
// Without an engine (no socket, no DOCKER_HOST) testcontainers-go fails in
// about a millisecond; the bound only matters for a socket that accepts and
// never answers.
const dockerProbeTimeout = 3 * time.Second

// backends are the ways to get a server; tests replace them to check the
// choice without Docker or PostgreSQL binaries.
type backends struct {
	getenv func(string) string
	// docker reports whether a Docker engine answers (nil: it does).
	docker func(ctx context.Context) error
	// container starts a PostgreSQL container and returns the DSN of its
	// maintenance database and the function that removes it.
	container func(ctx context.Context) (dsn string, stop func() error, err error)
	// initdb starts a throwaway server from the local binaries.
	initdb func(ctx context.Context) (*pgtemp.Server, error)
}

var defaultBackends = backends{
	docker:    dockerAnswers,
	container: startContainer,
	initdb:    func(ctx context.Context) (*pgtemp.Server, error) { return pgtemp.Start(ctx, pgtemp.Options{}) },
}

// server is the chosen source, started.
type server struct {
	source   Source
	adminDSN string
	// stop stops what pgtest started (nil for DATABASE_URL).
	stop func() error
}

// pick chooses and starts the tests' PostgreSQL: $DATABASE_URL when set
// (nothing else is tried); else a testcontainers-go container when a
// Docker engine answers; else, or when the container does not start, the
// local initdb. When none works the error names the three options and why
// each failed.
func (b backends) pick(ctx context.Context) (server, error) {
	if u := b.getenv(EnvDatabaseURL); u != "" {
		return server{source: SourceURL, adminDSN: u}, nil
	}
	pctx, cancel := context.WithTimeout(ctx, dockerProbeTimeout)
	dockerErr := b.docker(pctx)
	cancel()
	if dockerErr == nil {
		dsn, stop, err := b.container(ctx)
		if err == nil {
			return server{source: SourceContainer, adminDSN: dsn, stop: stop}, nil
		}
		dockerErr = fmt.Errorf("a Docker engine answers, but the %s container did not start: %w", ContainerImage, err)
	}
	s, initErr := b.initdb(ctx)
	if initErr == nil {
		return server{source: SourceInitdb, adminDSN: s.DSN("postgres"), stop: s.Stop}, nil
	}
	return server{}, fmt.Errorf("no PostgreSQL for the tests; one of these is needed:\n"+
		"  1. %s pointing at a server where the user may CREATE DATABASE (e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable);\n"+
		"  2. a Docker engine for testcontainers-go (image %s): %v;\n"+
		"  3. the PostgreSQL server binaries for initdb (initdb, postgres, pg_ctl; e.g. apt-get install postgresql; "+
		"as root, a `postgres` user to run them as): %w",
		EnvDatabaseURL, ContainerImage, dockerErr, initErr)
}

// dockerAnswers asks testcontainers-go's Docker client for the engine's
// info: nil when an engine answers.
func dockerAnswers(ctx context.Context) (err error) {
	defer func() {
		// The Docker client panics on some broken configurations (a
		// malformed DOCKER_HOST); that is "no engine", not a test crash.
		if r := recover(); r != nil {
			err = fmt.Errorf("docker client: %v", r)
		}
	}()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("no Docker engine: %w", err)
	}
	_ = cli.Close()
	return nil
}

// startContainer runs ContainerImage with testcontainers-go's postgres
// module (it waits for the server's second "ready to accept connections",
// after the image's init restart) and returns the DSN of its postgres
// database; stop terminates the container.
func startContainer(ctx context.Context) (string, func() error, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := postgres.Run(ctx, ContainerImage,
		postgres.WithDatabase("postgres"), postgres.WithUsername("postgres"), postgres.WithPassword("pgtest"),
		postgres.BasicWaitStrategies(),
		// The speed settings test/pgtemp uses: the data is thrown away.
		testcontainers.WithCmd("postgres", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
			"-c", "max_connections=200"))
	if err != nil {
		if c != nil {
			err = errors.Join(err, testcontainers.TerminateContainer(c))
		}
		return "", nil, fmt.Errorf("run postgres container: %w", err)
	}
	dsn, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", nil, errors.Join(fmt.Errorf("postgres container address: %w", err), testcontainers.TerminateContainer(c))
	}
	return dsn, func() error { return testcontainers.TerminateContainer(c) }, nil
}
