// Command faultctl is the controller of the fault suite (test/load,
// `make faults`): the same composition as `fleetrepair controller`
// (cmd/runner.Start, one cluster from a kubeconfig, TokenReview or static
// agent authentication) with the reconciler's fault injection
// (repair.Config.Crash) wired to a real SIGKILL: with --crash-at POINT the
// process kills itself the first time a repair passes POINT (one of
// repair.CrashPoints), so what the database and the API server hold is what
// a controller killed at that step leaves behind. It is test scaffolding:
// the production binary links no fault injection.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/repair"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "faultctl:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		o                              runner.Options
		cluster, kubeconfig, agentAuth string
		token, crashAt                 string
		cfg                            = config.Default()
	)
	flag.StringVar(&o.DatabaseURL, "database-url", "", "PostgreSQL connection string")
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:0", "HTTP listen address")
	flag.StringVar(&cluster, "cluster", "", "cluster name")
	flag.StringVar(&kubeconfig, "cluster-kubeconfig", "", "the cluster's kubeconfig (controller-runtime registers --kubeconfig)")
	flag.StringVar(&agentAuth, "agent-auth", "tokenreview", "tokenreview or static")
	flag.StringVar(&token, "agent-token", "", "the token of --agent-auth=static")
	flag.DurationVar(&cfg.Repair.Toleration, "toleration", 2*time.Second, "toleration of every reason")
	flag.DurationVar(&cfg.Repair.Resync, "resync", time.Second, "period of the pass over open repairs")
	flag.StringVar(&crashAt, "crash-at", "", "SIGKILL this process the first time a repair passes this point (repair.CrashPoints)")
	flag.Parse()
	if o.DatabaseURL == "" || cluster == "" || kubeconfig == "" {
		return errors.New("--database-url, --cluster and --cluster-kubeconfig are required")
	}
	if crashAt != "" && !slices.Contains(repair.CrashPoints, crashAt) {
		return fmt.Errorf("--crash-at %q: want one of %v", crashAt, repair.CrashPoints)
	}
	o.Log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	kcfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	k, err := kube.NewCached(cluster, kcfg, kube.CachedOptions{})
	if err != nil {
		return err
	}
	rcfg := rest.CopyConfig(kcfg)
	rcfg.QPS, rcfg.Burst = 100, 200 // as cmd/fleetrepair's TokenReview client
	cs, err := kubernetes.NewForConfig(rcfg)
	if err != nil {
		return fmt.Errorf("build clientset: %w", err)
	}
	o.Clusters = map[string]*kube.Cluster{cluster: k}
	switch agentAuth {
	case "tokenreview":
		o.Authenticator = &auth.TokenReview{Clusters: map[string]kubernetes.Interface{cluster: cs}}
	case "static":
		o.Authenticator = auth.StaticToken{Token: token}
	default:
		return fmt.Errorf("--agent-auth %q: want tokenreview or static", agentAuth)
	}
	// The suite repairs one node after another: no budget may hold one.
	cfg.Budgets.DeletionsPerHour, cfg.Budgets.NodePoolDeletionsPerHour, cfg.Budgets.MaxInFlightPerNodePool = 1000, 1000, 100
	o.Config = &cfg
	if crashAt != "" {
		o.Crash = func(point string) bool {
			if point != crashAt {
				return false
			}
			o.Log.Warn("fault injection: SIGKILL", "point", point)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way; never return into the reconcile
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := runner.Start(ctx, o)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}
