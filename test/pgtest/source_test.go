package pgtest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/test/pgtemp"
)

// fakeBackends records which sources were tried.
type fakeBackends struct {
	url                    string
	dockerErr, containerEr error
	initdbErr              error
	tried                  []Source
}

func (f *fakeBackends) backends() backends {
	return backends{
		getenv: func(k string) string {
			if k == EnvDatabaseURL {
				return f.url
			}
			return ""
		},
		docker: func(context.Context) error { f.tried = append(f.tried, "docker?"); return f.dockerErr },
		container: func(context.Context) (string, func() error, error) {
			f.tried = append(f.tried, SourceContainer)
			if f.containerEr != nil {
				return "", nil, f.containerEr
			}
			return "postgres://postgres:pgtest@127.0.0.1:32768/postgres?sslmode=disable", func() error { return nil }, nil
		},
		initdb: func(context.Context) (*pgtemp.Server, error) {
			f.tried = append(f.tried, SourceInitdb)
			if f.initdbErr != nil {
				return nil, f.initdbErr
			}
			return &pgtemp.Server{}, nil
		},
	}
}

// TestPick: the order DATABASE_URL, testcontainers (a Docker engine
// answers), initdb; a container that fails to start falls back to initdb;
// with none, one message names the three options and why each failed.
func TestPick(t *testing.T) {
	noEngine := errors.New("no Docker engine: Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
	for _, tc := range []struct {
		name  string
		f     fakeBackends
		want  Source
		tried string
	}{
		{"DATABASE_URL wins, nothing else is tried", fakeBackends{url: "postgres://db/postgres"}, SourceURL, ""},
		{"a Docker engine answers: a container", fakeBackends{}, SourceContainer, "docker? testcontainers"},
		{"no engine: initdb, no container attempted", fakeBackends{dockerErr: noEngine}, SourceInitdb, "docker? initdb"},
		{"the container fails: initdb", fakeBackends{containerEr: errors.New("pull access denied")}, SourceInitdb, "docker? testcontainers initdb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.f.backends().pick(context.Background())
			if err != nil || got.source != tc.want {
				t.Fatalf("pick = %s, %v; want %s", got.source, err, tc.want)
			}
			var tried []string
			for _, s := range tc.f.tried {
				tried = append(tried, string(s))
			}
			if strings.Join(tried, " ") != tc.tried {
				t.Errorf("tried %q, want %q", tried, tc.tried)
			}
			if got.source == SourceURL && got.adminDSN != tc.f.url || got.adminDSN == "" {
				t.Errorf("admin DSN %q", got.adminDSN)
			}
		})
	}
	f := fakeBackends{dockerErr: noEngine, initdbErr: errors.New("find PostgreSQL binaries: initdb not found")}
	_, err := f.backends().pick(context.Background())
	if err == nil {
		t.Fatal("pick with no source succeeded")
	}
	for _, words := range []string{EnvDatabaseURL, "Docker engine for testcontainers-go", "Cannot connect to the Docker daemon",
		"initdb, postgres, pg_ctl", "initdb not found"} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("error %q does not say %q", err, words)
		}
	}
}

// TestDockerAbsent: where no Docker engine answers (this machine),
// the probe says so, so the tests go on with initdb; the time it takes is
// measured by BenchmarkDockerProbe, not asserted here.
func TestDockerAbsent(t *testing.T) {
	if Using(t) == SourceContainer {
		t.Skip("a Docker engine answers here")
	}
	if err := dockerAnswers(context.Background()); err == nil {
		t.Fatalf("the probe says a Docker engine answers, but pgtest chose %s", Using(t))
	}
}

// BenchmarkDockerProbe measures the question "does a Docker engine
// answer?" that every test binary using pgtest asks once when
// DATABASE_URL is unset (go test -run x -bench DockerProbe ./test/pgtest/).
func BenchmarkDockerProbe(b *testing.B) {
	for b.Loop() {
		_ = dockerAnswers(context.Background())
	}
}
