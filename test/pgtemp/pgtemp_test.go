package pgtemp

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/test/parentdeath"
	"github.com/jackc/pgx/v5"
)

func TestStartStop(t *testing.T) {
	ctx := context.Background()
	begin := time.Now()
	s, err := Start(ctx, Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("ready in %v on port %d", time.Since(begin).Round(time.Millisecond), s.Port())
	dir := s.Dir()

	dsn := s.DSN("")
	if want := "postgres://postgres@127.0.0.1:" + strconv.Itoa(s.Port()) + "/postgres?sslmode=disable"; dsn != want {
		t.Errorf("DSN(\"\") = %q, want %q", dsn, want)
	}
	// The server answers on TCP and on its unix socket.
	if out, err := s.command(ctx, "pg_isready", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port())).CombinedOutput(); err != nil {
		t.Errorf("pg_isready over TCP: %v: %s", err, out)
	}
	if out, err := s.command(ctx, "pg_isready", "-h", filepath.Join(dir, "sock"), "-p", strconv.Itoa(s.Port())).CombinedOutput(); err != nil {
		t.Errorf("pg_isready over the unix socket: %v: %s", err, out)
	}
	if psql := filepath.Join(s.binDir, "psql"); fileExists(psql) {
		out, err := s.command(ctx, "psql", dsn, "-XAtc", "SHOW fsync").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "off" {
			t.Errorf("SHOW fsync = %q, %v; want off", out, err)
		}
	}

	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temporary directory %s still exists after Stop (stat: %v)", dir, err)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.Port()), time.Second); err == nil {
		c.Close()
		t.Errorf("port %d still accepts connections after Stop", s.Port())
	}
}

func TestStartPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	// An explicit port is not replaced: the error says why start-up failed.
	_, err = Start(context.Background(), Options{Port: port})
	if err == nil || !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("Start on a taken port: err = %v, want one naming the port in use", err)
	}
}

func TestFindBinDirErrors(t *testing.T) {
	empty := t.TempDir()
	_, err := FindBinDir(empty)
	if err == nil {
		t.Fatal("FindBinDir(empty dir) = nil error")
	}
	for _, want := range []string{empty, "initdb", "pg_ctl"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, err := exec.LookPath("pg_config"); err == nil {
		if _, err := FindBinDir(""); err != nil {
			t.Errorf("FindBinDir(\"\") with pg_config on PATH: %v", err)
		}
	}
}

func TestUnknownUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the user option applies only when running as root")
	}
	_, err := Start(context.Background(), Options{User: "no-such-user-pgtemp"})
	if err == nil || !strings.Contains(err.Error(), "no-such-user-pgtemp") || !strings.Contains(err.Error(), "root") {
		t.Fatalf("Start with a missing user: err = %v, want one naming the user and root", err)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestHaltResume: a halted server refuses connections and keeps its data;
// Resume brings the same database back on the same port.
func TestHaltResume(t *testing.T) {
	ctx := context.Background()
	s, err := Start(ctx, Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer s.Stop()
	conn, err := pgx.Connect(ctx, s.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	pid := s.PID()
	if pid == 0 {
		t.Fatal("PID() = 0 on a running server")
	}
	if err := s.Halt(); err != nil {
		t.Fatalf("Halt: %v", err)
	}
	if s.PID() != 0 {
		t.Errorf("PID() = %d after Halt, want 0", s.PID())
	}
	if err := s.Halt(); err == nil {
		t.Error("second Halt: no error")
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.Port()), time.Second); err == nil {
		c.Close()
		t.Fatalf("port %d accepts connections while halted", s.Port())
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if s.PID() == 0 || s.PID() == pid {
		t.Errorf("PID() = %d after Resume, want a new postmaster (was %d)", s.PID(), pid)
	}
	conn, err = pgx.Connect(ctx, s.DSN(""))
	if err != nil {
		t.Fatalf("connect after Resume: %v", err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 42 {
		t.Fatalf("row after Resume = %d, %v; want 42", v, err)
	}
	if err := s.Resume(ctx); err == nil {
		t.Error("Resume of a running server: no error")
	}
}

// serverHelperEnv makes TestServerHelperProcess the helper of
// TestServerDiesWithProcess.
const serverHelperEnv = "PGTEMP_TEST_SERVER_HELPER"

// TestServerHelperProcess starts a server, prints its postmaster's PID and
// waits to be killed.
func TestServerHelperProcess(t *testing.T) {
	if os.Getenv(serverHelperEnv) == "" {
		t.Skip("run by TestServerDiesWithProcess")
	}
	s, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("postmaster %d\n", s.PID())
	time.Sleep(10 * time.Minute)
}

// TestServerDiesWithProcess SIGKILLs a process that runs a server, so Stop
// never runs, and checks that the postmaster goes down with it (its
// parent-death signal, SIGQUIT: immediate shutdown).
func TestServerDiesWithProcess(t *testing.T) {
	helper, sc := parentdeath.Helper(t, "TestServerHelperProcess", serverHelperEnv)
	var pid int
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if _, err := fmt.Sscanf(sc.Text(), "postmaster %d", &pid); err == nil {
			break
		}
	}
	if pid == 0 {
		t.Fatalf("the helper printed no postmaster PID: %s", strings.Join(lines, "\n"))
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		i := strings.LastIndexByte(string(b), ')')
		if err != nil || (i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')) {
			return // gone, or a zombie nobody reaps
		}
		if time.Now().After(deadline) {
			t.Fatalf("postmaster %d outlived the process that started it by 60 s", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
