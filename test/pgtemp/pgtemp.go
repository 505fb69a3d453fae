// Package pgtemp starts a throwaway PostgreSQL server from the local server
// binaries (initdb, postgres, pg_ctl, pg_isready) in a temporary directory, for
// tests and for `fleetrepair demo`. The server listens on 127.0.0.1 on a free
// port and on a unix socket inside its directory, trusts every local
// connection, and trades durability for speed (fsync, synchronous_commit and
// full_page_writes are off): never point anything that matters at it.
//
// PostgreSQL refuses to run as root. When the current process is root, the
// server runs as an unprivileged user (Options.User, default "postgres") that
// owns the temporary directory; otherwise it runs as the current user.
//
// The postgres process is a child of the caller and receives SIGQUIT when the
// caller dies, so a crashed test binary does not leave a server running
// (its temporary directory stays behind; Stop removes it in the normal case).
package pgtemp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Superuser is the name of the database superuser initdb creates; every DSN
// returned by Server.DSN connects as it, without a password.
const Superuser = "postgres"

// EnvBinDir names the environment variable that overrides where the server
// binaries are looked up (the directory holding initdb, postgres and pg_ctl).
const EnvBinDir = "PGTEMP_BINDIR"

// Options configures Start. The zero value is ready to use.
type Options struct {
	// BinDir is the directory holding initdb, postgres, pg_ctl and pg_isready.
	// Empty: $PGTEMP_BINDIR, else `pg_config --bindir`, else the newest
	// /usr/lib/postgresql/*/bin, else the directory of initdb on PATH.
	BinDir string
	// User is the unprivileged OS user the server runs as when the current
	// process is root. Empty: "postgres". Ignored when not root.
	User string
	// Dir is the parent of the temporary directory. Empty: os.TempDir(). When
	// running as root, User must be able to traverse it.
	Dir string
	// Port is the TCP port on 127.0.0.1. 0: a free port chosen by the kernel.
	Port int
	// StartTimeout bounds initdb plus start-up. 0: 60 s.
	StartTimeout time.Duration
	// Settings are extra server settings passed as `-c name=value`, applied
	// after (and so overriding) the speed settings.
	Settings map[string]string
}

// Server is a running throwaway PostgreSQL server.
type Server struct {
	binDir   string
	dir      string // the temporary directory; removed by Stop
	dataDir  string
	sockDir  string
	logFile  string
	port     int
	cred     *syscall.Credential // nil: run as the current user
	settings map[string]string   // Options.Settings, kept for Resume

	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	werr error         // cmd.Wait's error, valid after done is closed

	stopOnce sync.Once
	stopErr  error

	// mu serializes Halt, Resume and Stop, which replace cmd and done.
	mu     sync.Mutex
	halted bool
}

// Start creates a database cluster in a new temporary directory and starts a
// server on it, returning once the server accepts connections. Errors name
// what is missing (binaries, the unprivileged user) and carry the tail of the
// server log when start-up fails.
func Start(ctx context.Context, opts Options) (*Server, error) {
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	binDir, err := FindBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		name := opts.User
		if name == "" {
			name = "postgres"
		}
		cred, err = lookupCredential(name)
		if err != nil {
			return nil, err
		}
	}
	port := opts.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp(opts.Dir, "pgtemp-")
	if err != nil {
		return nil, fmt.Errorf("create temporary directory: %w", err)
	}
	s := &Server{
		binDir:   binDir,
		dir:      dir,
		dataDir:  filepath.Join(dir, "data"),
		sockDir:  filepath.Join(dir, "sock"),
		logFile:  filepath.Join(dir, "postgres.log"),
		port:     port,
		cred:     cred,
		settings: opts.Settings,
		done:     make(chan struct{}),
	}
	err = s.initdb(ctx)
	// A free port found by listening can be taken by someone else before
	// postgres binds it: initdb is done once, the start is retried on a new
	// port (not when the caller chose the port).
	for attempt := 0; err == nil; attempt++ {
		err = s.start(ctx, opts.Settings)
		if err == nil || opts.Port != 0 || attempt == 2 || !errors.Is(err, errPortInUse) {
			break
		}
		s.kill()
		s.cmd, s.done, s.werr = nil, make(chan struct{}), nil
		if s.port, err = freePort(); err != nil {
			break
		}
	}
	if err != nil {
		s.kill()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// errPortInUse marks a start that failed because the port was taken.
var errPortInUse = errors.New("port already in use")

// initdb creates the database cluster in s.dataDir.
func (s *Server) initdb(ctx context.Context) error {
	if err := os.Mkdir(s.sockDir, 0o700); err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}
	if s.cred != nil {
		// The temporary directory and everything in it belong to the server's user.
		for _, p := range []string{s.dir, s.sockDir} {
			if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("chown %s to uid %d: %w", p, s.cred.Uid, err)
			}
		}
	}

	// initdb: trust auth (throwaway, loopback and a private socket only),
	// UTF8, no fsync of the new cluster.
	out, err := s.command(ctx, "initdb", "-D", s.dataDir, "-U", Superuser, "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions").CombinedOutput()
	if err != nil {
		return fmt.Errorf("run initdb: %w: %s", err, tail(out, 2000))
	}
	return nil
}

// start runs postgres on s.dataDir and waits until it accepts connections.
func (s *Server) start(ctx context.Context, settings map[string]string) error {
	args := []string{"-D", s.dataDir, "-p", strconv.Itoa(s.port), "-h", "127.0.0.1", "-k", s.sockDir}
	base := map[string]string{
		"fsync":                   "off",
		"synchronous_commit":      "off",
		"full_page_writes":        "off",
		"max_connections":         "200",
		"shared_buffers":          "64MB",
		"logging_collector":       "off",
		"log_min_messages":        "warning",
		"log_min_error_statement": "panic", // tests provoke errors on purpose
	}
	for k, v := range settings {
		base[k] = v
	}
	keys := make([]string, 0, len(base))
	for k := range base {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+base[k])
	}

	logf, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) // Resume appends
	if err != nil {
		return fmt.Errorf("create server log: %w", err)
	}
	defer logf.Close()
	// Not bound to ctx: the server outlives Start. Stop ends it.
	cmd := s.command(context.Background(), "postgres", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// SIGQUIT (immediate shutdown) when the caller dies without calling Stop.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.cmd = cmd
	go func() {
		s.werr = cmd.Wait()
		close(s.done)
	}()
	return s.waitReady(ctx)
}

// waitReady polls pg_isready until the server accepts connections, the server
// exits, or ctx ends.
func (s *Server) waitReady(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	exited := func() error {
		log := s.logTail()
		if strings.Contains(log, "Address already in use") {
			return fmt.Errorf("start postgres on port %d: %w: %s", s.port, errPortInUse, log)
		}
		return fmt.Errorf("start postgres: server exited (%v): %s", s.werr, log)
	}
	for {
		// Checked before each probe: a port held by something that is not
		// postgres would otherwise cost a pg_isready timeout per probe.
		select {
		case <-s.done:
			return exited()
		default:
		}
		// pg_isready exits 0 when the server accepts connections, 1 while it
		// rejects them (starting up), 2 when there is no response.
		err := s.command(ctx, "pg_isready", "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port),
			"-U", Superuser, "-d", "postgres", "-t", "1").Run()
		if err == nil {
			return nil
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return fmt.Errorf("run pg_isready: %w", err)
		}
		select {
		case <-s.done:
			return exited()
		case <-ctx.Done():
			return fmt.Errorf("wait for postgres on port %d: %w: %s", s.port, ctx.Err(), s.logTail())
		case <-tick.C:
		}
	}
}

// command builds a command for one of the server binaries, run as the
// server's user when the caller is root.
func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, name), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	env := []string{"LC_ALL=C", "LANG=C", "TZ=UTC", "PATH=" + os.Getenv("PATH")}
	if s.cred != nil {
		env = append(env, "HOME="+s.dir)
	} else if h := os.Getenv("HOME"); h != "" {
		env = append(env, "HOME="+h)
	}
	cmd.Env = env
	return cmd
}

// Port returns the TCP port the server listens on (127.0.0.1).
func (s *Server) Port() int { return s.port }

// Dir returns the server's temporary directory (data, socket and log).
func (s *Server) Dir() string { return s.dir }

// LogFile returns the path of the server log.
func (s *Server) LogFile() string { return s.logFile }

// DSN returns a connection URL for database dbname ("postgres" when empty)
// over TCP on 127.0.0.1, as the superuser, without TLS.
func (s *Server) DSN(dbname string) string {
	if dbname == "" {
		dbname = "postgres"
	}
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", Superuser, s.port, dbname)
}

// Stop shuts the server down (pg_ctl stop -m fast, falling back to signals)
// and removes its temporary directory. It is safe to call more than once,
// and after Halt.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Server) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.cmd != nil && !s.halted {
		errs = append(errs, s.pgCtlStop())
		s.kill()
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", s.dir, err))
	}
	return errors.Join(errs...)
}

// kill makes sure the postgres process is gone: SIGINT (fast shutdown), then
// SIGKILL after 10 s.
// pgCtlStop runs pg_ctl stop -m fast (disconnect every client, shut down
// cleanly) and waits up to 20 s for it.
func (s *Server) pgCtlStop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := s.command(ctx, "pg_ctl", "stop", "-D", s.dataDir, "-m", "fast", "-w", "-t", "20").CombinedOutput()
	if err != nil {
		return fmt.Errorf("run pg_ctl stop: %w: %s", err, tail(out, 1000))
	}
	return nil
}

// Halt shuts the server down like Stop (pg_ctl stop -m fast: open
// connections are closed, new ones are refused) but keeps its data
// directory and port, so that Resume brings the same database back: an
// outage of the database for tests of what its clients do meanwhile. It
// returns once the server process has exited. Halting a halted server is
// an error.
func (s *Server) Halt() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted {
		return errors.New("halt postgres: already halted")
	}
	err := s.pgCtlStop()
	s.kill()
	s.halted = true
	return err
}

// Resume starts a halted server again on the same data directory, port and
// settings, and returns once it accepts connections (bounded by ctx). The
// port was released by Halt; if another process took it meanwhile, Resume
// fails with the server log.
func (s *Server) Resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.halted {
		return errors.New("resume postgres: not halted")
	}
	s.cmd, s.done, s.werr = nil, make(chan struct{}), nil
	if err := s.start(ctx, s.settings); err != nil {
		s.kill()
		return fmt.Errorf("resume postgres: %w", err)
	}
	s.halted = false
	return nil
}

// PID returns the process id of the running postmaster (the parent of
// every backend), or 0 while the server is halted. The server's CPU time
// is that process's and its children's (/proc/PID/stat).
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted || s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logFile)
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	return "server log: " + tail(b, 2000)
}

func tail(b []byte, n int) string {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// FindBinDir returns the directory holding the PostgreSQL server binaries:
// dir when not empty, else $PGTEMP_BINDIR, else `pg_config --bindir`, else the
// newest /usr/lib/postgresql/*/bin, else the directory of initdb on PATH. The
// directory must hold initdb, postgres, pg_ctl and pg_isready.
func FindBinDir(dir string) (string, error) {
	var tried []string
	try := func(d, from string) (string, bool) {
		if d == "" {
			return "", false
		}
		if missing := missingBinaries(d); len(missing) > 0 {
			tried = append(tried, fmt.Sprintf("%s (%s: no %s)", d, from, strings.Join(missing, ", ")))
			return "", false
		}
		return d, true
	}
	if dir != "" {
		if d, ok := try(dir, "Options.BinDir"); ok {
			return d, nil
		}
		return "", fmt.Errorf("find PostgreSQL server binaries: %s", strings.Join(tried, "; "))
	}
	if d, ok := try(os.Getenv(EnvBinDir), "$"+EnvBinDir); ok {
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d, ok := try(strings.TrimSpace(string(out)), "pg_config --bindir"); ok {
			return d, nil
		}
	}
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(dirs) > 0 {
		// Newest major version first.
		sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
		for _, d := range dirs {
			if d, ok := try(d, "Debian layout"); ok {
				return d, nil
			}
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if d, ok := try(filepath.Dir(p), "initdb on PATH"); ok {
			return d, nil
		}
	}
	if len(tried) == 0 {
		tried = append(tried, "no candidate directory found")
	}
	return "", fmt.Errorf("find PostgreSQL server binaries (initdb, postgres, pg_ctl, pg_isready; install the PostgreSQL server, e.g. apt-get install postgresql, or set $%s): tried %s",
		EnvBinDir, strings.Join(tried, "; "))
}

func majorOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func missingBinaries(dir string) []string {
	var missing []string
	for _, name := range []string{"initdb", "postgres", "pg_ctl", "pg_isready"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	return missing
}

func lookupCredential(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("look up user %q to run PostgreSQL as (PostgreSQL refuses to run as root; create the user, e.g. useradd --system %s, or set Options.User): %w", name, name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse uid of user %q: %w", name, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse gid of user %q: %w", name, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("run PostgreSQL as user %q: it has uid 0, and PostgreSQL refuses to run as root", name)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
