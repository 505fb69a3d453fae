// Package parentdeath makes a child process that a library starts die
// with the process that started it, when the library offers no way to set
// the child's parent-death signal.
//
// A child started with exec.Cmd's SysProcAttr.Pdeathsig gets that signal
// from the kernel when its parent dies, however the parent ends: SIGTERM
// from timeout, Ctrl-C, go test's -timeout panic, SIGKILL. A library that
// builds its own exec.Cmd cannot be given one: controller-runtime's envtest
// starts etcd and kube-apiserver in their own process group (Setpgid, so a
// Ctrl-C reaches only the test) without a parent-death signal
// (sigs.k8s.io/controller-runtime pkg/internal/testing/process), so a test
// that ends without running its cleanups leaves both running under init.
//
// Wrapper writes an executable script to give the library instead of the
// binary. The script runs the calling program's own executable again (the
// test binary) with the real binary named in the environment; this
// package's init, in that copy, sets PR_SET_PDEATHSIG to SIGKILL and execs
// the real binary with the script's arguments, as the same process (the
// parent-death signal survives exec). Its parent is still the process that
// ran the script, which imported this package to call Wrapper. Linux only.
package parentdeath

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Variables of the script's environment, read and removed by init.
const (
	execEnv   = "FLEETREPAIR_PARENTDEATH_EXEC"   // the real binary
	parentEnv = "FLEETREPAIR_PARENTDEATH_PARENT" // the PID that must be its parent
)

// NiceEnv, given to Wrapper as NiceEnv+"=N" (N from 1 to 19), runs the
// real binary at niceness N: init sets it (setpriority) on the thread that
// execs, so every thread of the binary inherits it. test/load runs the
// simulated clusters' API servers so, below the controller it measures.
const NiceEnv = "FLEETREPAIR_PARENTDEATH_NICE"

func init() {
	bin, ok := os.LookupEnv(execEnv)
	if !ok {
		return
	}
	// init runs on the main thread; the signal is the thread's, and exec
	// keeps only the thread that calls it: the same one.
	runtime.LockOSThread()
	parent, nice := os.Getenv(parentEnv), os.Getenv(NiceEnv)
	_ = os.Unsetenv(execEnv)
	_ = os.Unsetenv(parentEnv)
	_ = os.Unsetenv(NiceEnv)
	if nice != "" {
		n, err := strconv.Atoi(nice)
		if err == nil && (n < 1 || n > 19) {
			err = fmt.Errorf("want 1 to 19")
		}
		if err == nil {
			// PRIO_PROCESS 0 is the calling thread on Linux: the one that execs.
			err = unix.Setpriority(unix.PRIO_PROCESS, 0, n)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "parentdeath: niceness %q for %s: %v\n", nice, bin, err)
			os.Exit(127)
		}
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "parentdeath: set the parent-death signal for %s: %v\n", bin, err)
		os.Exit(127)
	}
	if strconv.Itoa(os.Getppid()) != parent {
		// The parent died before the signal was set: nobody is left to
		// stop the real binary.
		fmt.Fprintf(os.Stderr, "parentdeath: parent %s gone before %s started\n", parent, bin)
		os.Exit(127)
	}
	err := unix.Exec(bin, append([]string{bin}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "parentdeath: exec %s: %v\n", bin, err)
	os.Exit(127)
}

// Wrapper writes an executable shell script named filepath.Base(bin) into
// dir that runs bin with the script's arguments, env (KEY=VALUE pairs)
// added to the environment, and SIGKILL as its parent-death signal: bin
// dies when the process that runs the script dies. Only the calling
// process may run the script (its PID is written in it); the script runs
// the caller's executable (os.Executable), which must still exist. It
// returns the script's path, or an error when os.Executable fails or the
// script cannot be written.
func Wrapper(dir, bin string, env ...string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("write parent-death wrapper of %s: %w", bin, err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return "", fmt.Errorf("write parent-death wrapper: %w", err)
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	for _, kv := range append([]string{execEnv + "=" + bin, parentEnv + "=" + strconv.Itoa(os.Getpid())}, env...) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return "", fmt.Errorf("write parent-death wrapper of %s: environment entry %q is not KEY=VALUE", bin, kv)
		}
		fmt.Fprintf(&b, "%s=%s\nexport %s\n", k, shellQuote(v), k)
	}
	fmt.Fprintf(&b, "exec %s \"$@\"\n", shellQuote(self))
	path := filepath.Join(dir, filepath.Base(bin))
	if err := os.WriteFile(path, []byte(b.String()), 0o755); err != nil {
		return "", fmt.Errorf("write parent-death wrapper of %s: %w", bin, err)
	}
	return path, nil
}

// shellQuote puts s in single quotes for sh: each single quote of s
// closes the quoting, is escaped with a backslash, and reopens it.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
