package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
	"github.com/fleetrepair/fleetrepair/agent/pipeline"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
)

// agentVersion is set at build time (-ldflags "-X main.agentVersion=...").
var agentVersion = "dev"

// runOptions are the flags of `fleetrepair-agent run`.
type runOptions struct {
	controller, cluster, node, token, tokenFile string
	kmsgPath                                    string
	seekEnd, acceptUser                         bool
	replay, replayFormat                        string
	bootID, bootIDFile                          string
	listen, rulesFile, spoolDir                 string
	flushInterval, heartbeatInterval            time.Duration
}

func newRunCmd(s streams) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent: read the kernel log, detect faults, report findings to the controller",
		Long: `Run the node agent. It reads /dev/kmsg (or replays a file with --replay),
turns kernel records into findings and sends them to the controller in batches;
critical findings (a GPU off the bus, a fatal AER) are sent at once. It serves
/metrics and /livez on --listen. Every flag has an environment fallback.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runAgent(cmd.Context(), o, s) },
	}
	f := cmd.Flags()
	f.StringVar(&o.controller, "controller", os.Getenv("FLEETREPAIR_CONTROLLER"), "controller base URL (env FLEETREPAIR_CONTROLLER)")
	f.StringVar(&o.cluster, "cluster", os.Getenv("FLEETREPAIR_CLUSTER"), "cluster name as the controller knows it (env FLEETREPAIR_CLUSTER)")
	f.StringVar(&o.node, "node", os.Getenv("NODE_NAME"), "this node's Kubernetes name (env NODE_NAME, from the downward API)")
	f.StringVar(&o.token, "token", os.Getenv("FLEETREPAIR_TOKEN"), "static bearer token (env FLEETREPAIR_TOKEN)")
	f.StringVar(&o.tokenFile, "token-file", os.Getenv("FLEETREPAIR_TOKEN_FILE"), "file holding the bearer token, re-read on every request (projected ServiceAccount token)")
	f.StringVar(&o.kmsgPath, "kmsg", kmsg.DevKmsgPath, "kernel log device")
	f.BoolVar(&o.seekEnd, "kmsg-seek-end", false, "start at the end of the kernel ring buffer (default: from the oldest record, to catch faults from before the agent started)")
	f.BoolVar(&o.acceptUser, "accept-user-facility", false, "TESTS ONLY: also accept records written to /dev/kmsg from user space")
	f.StringVar(&o.replay, "replay", "", "replay this kernel-log file instead of reading --kmsg (demos, tests)")
	f.StringVar(&o.replayFormat, "replay-format", "auto", "format of --replay: "+formatNames())
	f.StringVar(&o.bootID, "boot-id", "", "boot ID override (default: read --boot-id-file)")
	f.StringVar(&o.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding the kernel boot ID")
	f.StringVar(&o.listen, "listen", ":9400", "address for /metrics and /livez (empty: none)")
	f.StringVar(&o.rulesFile, "rules", "", "kernel pattern rules file replacing the embedded rules")
	f.StringVar(&o.spoolDir, "spool-dir", "", "directory for the on-disk spool that survives restarts (empty: memory only)")
	f.DurationVar(&o.flushInterval, "flush-interval", uplink.DefaultFlushInterval, "longest wait before a non-critical finding is sent")
	f.DurationVar(&o.heartbeatInterval, "heartbeat-interval", uplink.DefaultHeartbeatInterval, "longest time between two reports")
	return cmd
}

func formatNames() string {
	var n []string
	for _, f := range kmsg.Formats() {
		n = append(n, string(f))
	}
	return strings.Join(n, ", ")
}

func runAgent(ctx context.Context, o runOptions, s streams) error {
	var missing []string
	for name, v := range map[string]string{"--controller": o.controller, "--cluster": o.cluster, "--node": o.node} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return usageError{fmt.Errorf("required: %s", strings.Join(missing, ", "))}
	}
	log := slog.New(slog.NewJSONHandler(s.err, nil)).With("node", o.node)
	boot := o.bootID
	if boot == "" {
		b, err := os.ReadFile(o.bootIDFile)
		if err != nil {
			return fmt.Errorf("read boot id: %w", err)
		}
		boot = strings.TrimSpace(string(b))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	up, err := uplink.New(uplink.Config{URL: o.controller, Cluster: o.cluster, Node: o.node, BootID: boot,
		AgentVersion: agentVersion, Token: o.token, TokenFile: o.tokenFile, FlushInterval: o.flushInterval,
		HeartbeatInterval: o.heartbeatInterval, SpoolDir: o.spoolDir, Logger: log, Registerer: reg})
	if err != nil {
		return usageError{err}
	}
	dopts := detect.Options{Node: o.node, BootID: boot}
	if o.rulesFile != "" {
		if dopts.Rules, err = detect.LoadRules(o.rulesFile); err != nil {
			return usageError{err}
		}
	}
	var src pipeline.Source
	if o.replay != "" {
		format, err := kmsg.ParseFormat(o.replayFormat)
		if err != nil {
			return usageError{err}
		}
		src = pipeline.Replay{Path: o.replay, Format: format}
	} else {
		r, err := kmsg.Open(kmsg.ReaderOptions{Path: o.kmsgPath, SeekEnd: o.seekEnd, AcceptUserFacility: o.acceptUser})
		if err != nil {
			return fmt.Errorf("open kernel log: %w", err)
		}
		defer r.Close()
		src = r
		if o.acceptUser {
			log.Warn("accepting user-facility kernel records: any root process can fake findings; never use this in production")
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	if o.listen != "" {
		ln, err := net.Listen("tcp", o.listen)
		if err != nil {
			return fmt.Errorf("listen for metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve metrics: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	log.Info("agent running", "controller", o.controller, "cluster", o.cluster, "boot_id", boot, "version", agentVersion)
	g.Go(func() error {
		return pipeline.Run(ctx, pipeline.Config{Source: src, Uplink: up, Detector: dopts, Log: log})
	})
	return g.Wait()
}
