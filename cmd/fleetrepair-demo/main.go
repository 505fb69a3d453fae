// Command fleetrepair-demo runs the self-contained demo: a throwaway
// PostgreSQL, a simulated fleet (client fakes and a simulated Karpenter),
// real agent pipelines replaying kernel logs of the case corpus, the
// controller and its dashboard. It is its own binary so that the production
// controller (cmd/fleetrepair) links no test harness, fake or fixture.
//
// main only wires the process: signals, streams and the exit code.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := newDemoCmd()
	cmd.SetArgs(os.Args[1:])
	err := cmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetrepair-demo:", err)
		os.Exit(1)
	}
}
