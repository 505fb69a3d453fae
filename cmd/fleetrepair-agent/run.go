package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
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
	"github.com/fleetrepair/fleetrepair/agent/schedule"
	"github.com/fleetrepair/fleetrepair/agent/source"
	"github.com/fleetrepair/fleetrepair/agent/source/cri"
	"github.com/fleetrepair/fleetrepair/agent/source/dcgm"
	"github.com/fleetrepair/fleetrepair/agent/source/hostroot"
	"github.com/fleetrepair/fleetrepair/agent/source/kubelet"
	"github.com/fleetrepair/fleetrepair/agent/source/nvml"
	"github.com/fleetrepair/fleetrepair/agent/source/procfs"
	"github.com/fleetrepair/fleetrepair/agent/source/sysfs"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
)

// agentVersion is set at build time (-ldflags "-X main.agentVersion=...").
var agentVersion = "dev"

// runOptions are the flags of `fleetrepair-agent run`.
type runOptions struct {
	controller, cluster, node, token, tokenFile string
	caFile                                      string
	kmsgPath                                    string
	seekEnd, acceptUser                         bool
	replay, replayFormat                        string
	bootID, bootIDFile                          string
	listen, rulesFile, spoolDir                 string
	flushInterval, heartbeatInterval            time.Duration

	hostRoot, instanceType, dcgmAddress     string
	criSocket, kubeletHealthz               string
	expectedGPUs                            int
	monitorInterval, kmsgCoalesce           time.Duration
	noNVML, noDCGM, noSysfs, noStuckProcess bool
}

func newRunCmd(s streams) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent: read the kernel log, detect faults, report findings to the controller",
		Long: `Run the node agent. It reads /dev/kmsg (or replays a file with --replay),
turns kernel records into findings and sends them to the controller in batches;
critical findings (a GPU off the bus, a fatal AER) are sent at once. Every
--monitor-interval, from one scheduler whose phases are hashed from the node
name, it checks the GPUs on the PCI bus (sysfs), NVML, DCGM health, the
container runtime (CRI), the kubelet and stuck GPU processes; DCGM policy
violations are pushed. The heartbeat carries every monitor's state
(ok|failing|unknown|absent), the driver version and the GPU inventory. It
serves /metrics, /livez and /readyz on --listen (ready: the controller accepted
a report within three --heartbeat-interval).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runAgent(cmd.Context(), o, s) },
	}
	f := cmd.Flags()
	f.StringVar(&o.controller, "controller", os.Getenv("FLEETREPAIR_CONTROLLER"), "controller base URL (env FLEETREPAIR_CONTROLLER)")
	f.StringVar(&o.caFile, "ca-file", os.Getenv("FLEETREPAIR_CA_FILE"), "PEM bundle of the CAs the controller's HTTPS certificate chains to (env FLEETREPAIR_CA_FILE; default: the system roots)")
	f.StringVar(&o.cluster, "cluster", os.Getenv("FLEETREPAIR_CLUSTER"), "cluster name as the controller knows it (env FLEETREPAIR_CLUSTER)")
	f.StringVar(&o.node, "node", os.Getenv("NODE_NAME"), "this node's Kubernetes name (env NODE_NAME, from the downward API)")
	f.StringVar(&o.token, "token", os.Getenv("FLEETREPAIR_TOKEN"), "static bearer token (env FLEETREPAIR_TOKEN)")
	f.StringVar(&o.tokenFile, "token-file", os.Getenv("FLEETREPAIR_TOKEN_FILE"), "file holding the bearer token, re-read on every request (projected ServiceAccount token)")
	f.StringVar(&o.kmsgPath, "kmsg", kmsg.DevKmsgPath, "kernel log device")
	f.BoolVar(&o.seekEnd, "kmsg-seek-end", false, "start at the end of the kernel ring buffer (default: from the oldest record, to catch faults from before the agent started)")
	f.DurationVar(&o.kmsgCoalesce, "kmsg-coalesce", 50*time.Millisecond, "once caught up with the kernel log, wait this long before waiting for the next record (one wake-up per burst, not per record); 0 disables")
	f.BoolVar(&o.acceptUser, "accept-user-facility", false, "TESTS ONLY: also accept records written to /dev/kmsg from user space")
	f.StringVar(&o.replay, "replay", "", "replay this kernel-log file instead of reading --kmsg (demos, tests)")
	f.StringVar(&o.replayFormat, "replay-format", "auto", "format of --replay: "+formatNames())
	f.StringVar(&o.bootID, "boot-id", "", "boot ID override (default: read --boot-id-file)")
	f.StringVar(&o.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "file holding the kernel boot ID")
	f.StringVar(&o.listen, "listen", ":9400", "address for /metrics, /livez and /readyz (empty: none)")
	f.StringVar(&o.rulesFile, "rules", "", "kernel pattern rules file replacing the embedded rules")
	f.StringVar(&o.spoolDir, "spool-dir", "", "directory for the on-disk spool that survives restarts (empty: memory only)")
	f.DurationVar(&o.flushInterval, "flush-interval", uplink.DefaultFlushInterval, "longest wait before a non-critical finding is sent")
	f.DurationVar(&o.heartbeatInterval, "heartbeat-interval", uplink.DefaultHeartbeatInterval, "longest time between two reports")
	f.StringVar(&o.hostRoot, "host-root", envOr("FLEETREPAIR_HOST_ROOT", "/"), "where the host's / is mounted (/sys, /proc, /run are read below it)")
	f.IntVar(&o.expectedGPUs, "expected-gpus", 0, "GPUs this node must have (0: from --instance-type or the DMI product name)")
	f.StringVar(&o.instanceType, "instance-type", os.Getenv("FLEETREPAIR_INSTANCE_TYPE"), "instance type for the expected GPU count (default: DMI product name)")
	f.DurationVar(&o.monitorInterval, "monitor-interval", time.Minute, "period of the polled monitors (sysfs, NVML, DCGM health, CRI, kubelet)")
	f.BoolVar(&o.noSysfs, "no-sysfs", false, "disable the sysfs GPU count and AER monitor")
	f.BoolVar(&o.noNVML, "no-nvml", false, "disable the NVML monitor")
	f.BoolVar(&o.noDCGM, "no-dcgm", false, "disable the DCGM monitors")
	f.BoolVar(&o.noStuckProcess, "no-stuck-process", false, "disable the stuck GPU process monitor")
	f.StringVar(&o.dcgmAddress, "dcgm-address", "localhost:5555", "nv-hostengine address")
	f.StringVar(&o.criSocket, "cri-socket", cri.DefaultSocket, "CRI socket of the container runtime, below --host-root (empty: no probe)")
	f.StringVar(&o.kubeletHealthz, "kubelet-healthz", kubelet.DefaultURL, "kubelet health URL (empty: no probe)")
	return cmd
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// monitors builds the polled and pushed monitors from the options. A GPU is
// expected when a count is configured or known for the instance type, or
// when sysfs sees an NVIDIA GPU: then a missing NVML or DCGM library is a
// monitoring-plane problem (unknown), else the monitor is absent.
func monitors(o runOptions) ([]pipeline.Monitor, []source.Pusher, *sysfs.Source) {
	root := hostroot.Root(o.hostRoot)
	every := o.monitorInterval
	var ms []pipeline.Monitor
	var ps []source.Pusher
	var sys *sysfs.Source
	expect := o.expectedGPUs > 0
	if !o.noSysfs {
		sys = sysfs.New(sysfs.Options{Root: root, Expected: o.expectedGPUs, InstanceType: o.instanceType})
		gpus, _ := sys.GPUs()
		expect = expect || sys.Expected() > 0 || len(gpus) > 0
		ms = append(ms, pipeline.Monitor{Checker: sys, Every: every})
	}
	if !o.noNVML {
		ms = append(ms, pipeline.Monitor{Checker: nvml.New(nvml.Options{ExpectGPUs: expect, Versions: root.DriverVersions}), Every: every})
	}
	if !o.noDCGM {
		health, policy := dcgm.New(dcgm.Options{Address: o.dcgmAddress, ExpectGPUs: expect})
		ms = append(ms, pipeline.Monitor{Checker: health, Every: every})
		ps = append(ps, policy)
	}
	if o.criSocket != "" {
		ms = append(ms, pipeline.Monitor{Checker: cri.New(cri.Options{Socket: root.Path(o.criSocket)}), Every: every})
	}
	if o.kubeletHealthz != "" {
		ms = append(ms, pipeline.Monitor{Checker: kubelet.New(kubelet.Options{URL: o.kubeletHealthz}), Every: every})
	}
	if !o.noStuckProcess {
		ms = append(ms, pipeline.Monitor{Checker: procfs.New(procfs.Options{Root: root}), Every: every})
	}
	return ms, ps, sys
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
	if o.heartbeatInterval <= 0 || o.expectedGPUs < 0 {
		return usageError{fmt.Errorf("--heartbeat-interval must be positive and --expected-gpus >= 0 (got %s, %d)", o.heartbeatInterval, o.expectedGPUs)}
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
		AgentVersion: agentVersion, Token: o.token, TokenFile: o.tokenFile, CAFile: o.caFile, FlushInterval: o.flushInterval,
		HeartbeatInterval: o.heartbeatInterval, SpoolDir: o.spoolDir, Logger: log, Registerer: reg})
	if err != nil {
		return usageError{err}
	}
	// One P unless GOMAXPROCS says otherwise: the agent never needs more than
	// a core, must never burst on several beside a training job, and with one
	// P a record read and detected stays on one thread instead of waking a
	// second one per record (measured: about 4x fewer context switches under
	// a kernel-log flood; see test/agentbench).
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	if o.monitorInterval <= 0 {
		return usageError{fmt.Errorf("--monitor-interval must be positive, got %s", o.monitorInterval)}
	}
	ms, ps, sys := monitors(o)
	dopts := detect.Options{Node: o.node, BootID: boot}
	if sys != nil {
		dopts.GPUBehindPort = sys.GPUBehindPort
	}
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
		if _, err := os.Stat(o.replay); err != nil {
			return fmt.Errorf("replay file: %w", err)
		}
		src = pipeline.Replay{Path: o.replay, Format: format}
	} else {
		// Opened by the pipeline, which keeps the other monitors running
		// and retries with backoff when the device cannot be opened (no
		// /dev/kmsg in the container, EPERM under the device cgroup): the
		// heartbeat then says kernel-log unknown, with the error.
		dev := &kmsg.Device{Options: kmsg.ReaderOptions{Path: o.kmsgPath, SeekEnd: o.seekEnd, AcceptUserFacility: o.acceptUser, Coalesce: o.kmsgCoalesce}}
		defer dev.Close()
		src = dev
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
		mux.Handle("/readyz", readyz{reg: reg, within: 3 * o.heartbeatInterval, now: time.Now})
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
		return pipeline.Run(ctx, pipeline.Config{Source: src, Uplink: up, Detector: dopts, Log: log,
			Monitors: ms, Pushers: ps, Schedule: schedule.Options{Node: o.node}, Registerer: reg})
	})
	return g.Wait()
}
