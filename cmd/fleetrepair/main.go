// Command fleetrepair is the fleetrepair controller and its client.
//
//	controller   run the controller (ingest, diagnosis, repair, API)
//	migrate      apply or roll back the database migrations
//	diagnose     print the diagnoses the rules reach for findings (JSON lines)
//	repairs      list and show repairs; how to approve a held one (API)
//	approve      approve a repair awaiting approval (approver token)
//	reject       reject a repair awaiting approval (approver token)
//	breakers     list breakers with their evidence; resume one, or the kill switch (admin token)
//	nodes        list nodes with their health; show one (API)
//	simulate     replay fleet scenarios through the real policy and two baselines
//	shadow       what the current policy would have done with the stored findings (API)
//	report-job   send a job's NCCL network failures (Slurm epilog, Kubeflow hook, CI; reporter token)
//
// The client commands reach the controller through web/apiclient (generated
// from web/api/openapi.yaml) at the server of a context of
// ~/.config/fleetrepair/config.yaml, or through a kubeconfig context's API
// server (connect.go; docs/cli.md).
//
// main only wires the process: signals, streams and the exit code.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
	root.AddCommand(newControllerCmd(), newMigrateCmd(), newDiagnoseCmd(), newRepairsCmd(), newDecisionCmd("approve"), newDecisionCmd("reject"), newBreakersCmd(), newNodesCmd(), newSimulateCmd(), newShadowCmd(), newReportJobCmd())
	return root.ExecuteContext(ctx)
}

// envOr returns the environment variable k, or def when it is unset.
func envOr(k, def string) string {
	if v, ok := os.LookupEnv(k); ok {
		return v
	}
	return def
}

// flagsFromEnv sets every flag of cmd that was not given on the command
// line from its environment variable, when that is set: env names the
// variable of some flags (flag name -> variable), every other flag reads
// FLEETREPAIR_<NAME> (capitals, dashes as underscores). The value is parsed
// as the flag would parse it, so a malformed value (FLEETREPAIR_DRY_RUN=yes,
// FLEETREPAIR_WORKERS=four) is an error that names the variable, never a
// silent default.
func flagsFromEnv(cmd *cobra.Command, env map[string]string) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		key := envName(f.Name, env)
		v, set := os.LookupEnv(key)
		if !set {
			return
		}
		if serr := cmd.Flags().Set(f.Name, v); serr != nil {
			err = fmt.Errorf("environment %s=%q (for --%s): %w", key, v, f.Name, serr)
		}
	})
	return err
}

// envName is the environment variable of flag name: env[name] when env
// names one, else FLEETREPAIR_<NAME> (capitals, dashes as underscores).
func envName(name string, env map[string]string) string {
	if key, ok := env[name]; ok {
		return key
	}
	return "FLEETREPAIR_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}
