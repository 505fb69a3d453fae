// Command fleetrepair is the fleetrepair controller and its client.
//
//	controller   run the controller (ingest, diagnosis, repair, API)
//	migrate      apply or roll back the database migrations
//	diagnose     print the diagnoses the rules reach for findings (JSON lines)
//	repairs      list and show repair history through the API
//	approve      approve a repair awaiting approval (operator token)
//	reject       reject a repair awaiting approval (operator token)
//	breakers     list breakers; resume one, or the kill switch (admin token)
//	simulate     replay fleet scenarios through the real policy and two baselines
//	shadow       what the current policy would have done with the stored findings (API)
//	demo         run the self-contained demo (throwaway PostgreSQL, simulated fleet)
//
// main only wires the process: signals, streams and the exit code.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetrepair:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) error {
	root := &cobra.Command{
		Use:           "fleetrepair",
		Short:         "fleetrepair keeps Kubernetes GPU fleets healthy without replacing half of them by mistake",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	root.AddCommand(newControllerCmd(), newMigrateCmd(), newDiagnoseCmd(), newRepairsCmd(), newDemoCmd(), newDecisionCmd("approve"), newDecisionCmd("reject"), newBreakersCmd(), newSimulateCmd(), newShadowCmd())
	return root.ExecuteContext(ctx)
}

// envOr returns the environment variable k, or def when it is unset.
func envOr(k, def string) string {
	if v, ok := os.LookupEnv(k); ok {
		return v
	}
	return def
}

// flagsFromEnv sets every flag in env (flag name -> environment variable)
// that was not given on the command line from its environment variable, if
// set, parsing it as the flag would: a malformed value is an error that
// names the variable, never a silent default.
func flagsFromEnv(cmd *cobra.Command, env map[string]string) error {
	for name, key := range env {
		v, ok := os.LookupEnv(key)
		if !ok || cmd.Flags().Changed(name) {
			continue
		}
		if err := cmd.Flags().Set(name, v); err != nil {
			return fmt.Errorf("environment %s=%q (for --%s): %w", key, v, name, err)
		}
	}
	return nil
}
