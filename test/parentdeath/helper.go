package parentdeath

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
)

// Helper starts this test binary again, running only the test named (the
// helper-process pattern of os/exec's own tests) with env=1 in its
// environment, and returns it with its standard output, line by line. The helper
// is killed and reaped when t ends, so a test may SIGKILL it first and
// check what its children did. A helper that cannot start fails t.
func Helper(t testing.TB, name, env string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v")
	cmd.Env = append(os.Environ(), env+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}
