// Command fleetrepair-agent is the fleetrepair node agent. It reads the
// node's kernel log (and, later, DCGM, NVML and the container runtime) and
// reports findings, facts never actions, to the controller.
//
// Subcommands:
//
//	scan   read kernel log files (or stdin) and print the findings as JSON lines
//
// main only wires the process (signals, streams, exit code); every
// subcommand is a cobra command built in its own file.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed (unreadable file, ...)
	exitUsage = 2 // bad flags or arguments
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], streams{in: os.Stdin, out: os.Stdout, err: os.Stderr})
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// streams are the process's standard streams, injectable for tests.
type streams struct {
	in       io.Reader
	out, err io.Writer
}

// run executes the command line args (without the program name).
func run(ctx context.Context, args []string, s streams) error {
	root := newRootCmd(s)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// newRootCmd builds the command tree. Subcommands are added here, one
// constructor each.
func newRootCmd(s streams) *cobra.Command {
	root := &cobra.Command{
		Use:           "fleetrepair-agent",
		Short:         "fleetrepair node agent: reports GPU node faults as findings",
		SilenceUsage:  true, // errors are printed once, by exitCode
		SilenceErrors: true,
	}
	root.SetIn(s.in)
	root.SetOut(s.out)
	root.SetErr(s.err)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newScanCmd(s), newRunCmd(s))
	return root
}

// usageError marks a bad command line (exit 2, with a hint to --help).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitCode prints err (if any) once and returns the process exit code.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "fleetrepair-agent: %v\nRun 'fleetrepair-agent --help' for usage.\n", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "fleetrepair-agent: %v\n", err)
	return exitError
}
