package parentdeath_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/test/parentdeath"
)

// helperEnv makes TestHelperProcess the helper: a process that starts two
// sleeps as envtest starts its binaries (own process group, no
// parent-death signal of their own), one through a Wrapper, prints their
// PIDs and waits to be killed.
const helperEnv = "PARENTDEATH_TEST_HELPER"

func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("run by TestChildDiesWithParent")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	wrapper, err := parentdeath.Wrapper(t.TempDir(), sleep, "PARENTDEATH_TEST_MARK=it's here")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, bin := range []string{wrapper, sleep} {
		cmd := exec.Command(bin, "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, strconv.Itoa(cmd.Process.Pid))
	}
	fmt.Printf("pids %s\n", strings.Join(pids, " "))
	time.Sleep(10 * time.Minute)
}

// TestChildDiesWithParent SIGKILLs the helper and checks that the sleep
// started through the wrapper ran as sleep, with the wrapper's environment,
// and died with the helper, while the one started plainly lives on under
// init (what envtest's etcd and kube-apiserver did).
func TestChildDiesWithParent(t *testing.T) {
	helper, sc := parentdeath.Helper(t, "TestHelperProcess", helperEnv)
	var wrapped, plain int
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "pids %d %d", &wrapped, &plain); err == nil {
			break
		}
	}
	if wrapped == 0 || plain == 0 {
		t.Fatalf("the helper printed no pids: %v", sc.Err())
	}
	t.Cleanup(func() { _ = syscall.Kill(plain, syscall.SIGKILL); _ = syscall.Kill(wrapped, syscall.SIGKILL) })

	// The wrapped child becomes sleep itself (exec), with the extra variable
	// and without the wrapper's own.
	deadline := time.Now().Add(30 * time.Second)
	for {
		exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(wrapped), "exe"))
		if filepath.Base(exe) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d runs %q, want sleep", wrapped, exe)
		}
		time.Sleep(20 * time.Millisecond)
	}
	environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(wrapped), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	vars := bytes.Split(environ, []byte{0})
	if !containsVar(vars, "PARENTDEATH_TEST_MARK=it's here") || hasPrefix(vars, "FLEETREPAIR_PARENTDEATH_") {
		t.Fatalf("sleep's environment: %q", environ)
	}
	if got := ppid(t, wrapped); got != helper.Process.Pid {
		t.Fatalf("sleep's parent is %d, want the helper %d", got, helper.Process.Pid)
	}

	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	deadline = time.Now().Add(60 * time.Second)
	for alive(wrapped) {
		if time.Now().After(deadline) {
			t.Fatalf("the wrapped child %d outlived its parent by 60 s", wrapped)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The control: the plain child is still running, under another parent.
	if !alive(plain) {
		t.Fatalf("the plain child %d died with its parent too: the test cannot tell the wrapper's effect", plain)
	}
}

func containsVar(vars [][]byte, kv string) bool {
	for _, v := range vars {
		if string(v) == kv {
			return true
		}
	}
	return false
}

func hasPrefix(vars [][]byte, p string) bool {
	for _, v := range vars {
		if bytes.HasPrefix(v, []byte(p)) {
			return true
		}
	}
	return false
}

// alive reports whether pid runs: it exists and is not a zombie (a
// container's init may never reap it).
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

func ppid(t *testing.T, pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	n, _ := strconv.Atoi(f[1])
	return n
}

func TestWrapperRefusesBadEnvironment(t *testing.T) {
	if _, err := parentdeath.Wrapper(t.TempDir(), "/bin/true", "NOEQUALS"); err == nil {
		t.Fatal("Wrapper took an environment entry without '='")
	}
}

// TestWrapperNice: a wrapper given NiceEnv runs its binary at that
// niceness (nice(1) with no arguments prints its own), and a bad value is
// refused instead of running the binary at the wrong one.
func TestWrapperNice(t *testing.T) {
	nice, err := exec.LookPath("nice")
	if err != nil {
		t.Fatalf("nice(1) not found (Debian package coreutils): %v", err)
	}
	for _, tc := range []struct {
		value, want string
		fails       bool
	}{{"7", "7", false}, {"19", "19", false}, {"0", "", true}, {"abc", "", true}} {
		w, err := parentdeath.Wrapper(t.TempDir(), nice, parentdeath.NiceEnv+"="+tc.value)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(w).CombinedOutput()
		switch {
		case tc.fails && (err == nil || !strings.Contains(string(out), "niceness")):
			t.Errorf("niceness %q: %v, output %q; want refused naming the niceness", tc.value, err, out)
		case !tc.fails && (err != nil || strings.TrimSpace(string(out)) != tc.want):
			t.Errorf("niceness %q: %v, output %q; want %s", tc.value, err, out, tc.want)
		}
	}
}
