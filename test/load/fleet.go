package load

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/envtest"
)

// otherCluster is one of the fleet scenario's clusters after the first: its
// own kube-apiserver and etcd, Nodes only.
type otherCluster struct {
	name string
	env  *envtest.Env
	cs   kubernetes.Interface
}

// fleet reports whether this run is the multi-cluster fleet scenario.
func (h *harness) fleet() bool { return h.cfg.Clusters > 1 }

// clusterNames are the names the controller serves, the first cluster's first.
func (h *harness) clusterNames() []string {
	out := []string{Cluster}
	for _, o := range h.others {
		out = append(out, o.name)
	}
	return out
}

// clients builds the harness's own clients of env, whose requests are
// counted apart (ownReqs) and taken out of the API server figures.
func (h *harness) clients(env *envtest.Env) (client.Client, kubernetes.Interface, error) {
	kcfg := rest.CopyConfig(env.Config)
	kcfg.QPS, kcfg.Burst = 2000, 4000
	kcfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{base: rt, n: &h.ownReqs} })
	kc, err := client.New(kcfg, client.Options{Scheme: kube.Scheme}) // protobuf for built-in types, JSON for CRDs, by itself
	if err != nil {
		return nil, nil, fmt.Errorf("build client: %w", err)
	}
	// The clientset (built-in types only: createBareNode) in protobuf too,
	// as the controller's informers read Nodes. BenchmarkCreateBareNode
	// found no measurable difference to JSON on a loaded machine (a create's
	// cost is the API server's admission, etcd write and watch fan-out).
	pcfg := rest.CopyConfig(kcfg)
	pcfg.ContentType = runtime.ContentTypeProtobuf
	cs, err := kubernetes.NewForConfig(pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("build clientset: %w", err)
	}
	return kc, cs, nil
}

// setupOtherClusters starts the Clusters-1 other API servers, batch at a
// time (fifty starting at once on two cores miss envtest's start timeout),
// each with SmallAPIServerGOGC, and creates each cluster's share of the
// Nodes (Nodes minus the first cluster's first, spread evenly) as soon as
// its API server is up, while the next batch starts: otherCreators per
// cluster, at most otherInFlight creates at once over all of them, so
// starting API servers still get CPU. It returns the Nodes by cluster, or
// the first creation error. It must run on the test's goroutine
// (envtest.StartN fails the test when a server does not start).
func (h *harness) setupOtherClusters(ctx context.Context, first int) ([]*node, error) {
	const batch, otherCreators, otherInFlight = 5, 4, 32
	n := h.cfg.Clusters - 1
	per := make([][]*node, n)
	for i := range h.cfg.Nodes - first {
		c := i % n
		zone := h.zones[1+len(per[c])%(len(h.zones)-1)]
		per[c] = append(per[c], &node{name: fmt.Sprintf("gpu-%s-%05d", zone[len(zone)-1:], len(per[c])), zone: zone,
			cluster: fmt.Sprintf("%s-%02d", Cluster, c+1), boot: uuid.NewString()})
	}
	start := time.Now()
	var created atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	inFlight := make(chan struct{}, otherInFlight)
	create := func(cs kubernetes.Interface, nodes []*node) {
		work := make(chan *node)
		for range otherCreators {
			wg.Go(func() {
				for n := range work {
					inFlight <- struct{}{}
					err := createBareNode(ctx, cs, n)
					<-inFlight
					if err != nil {
						failed.CompareAndSwap(nil, err)
					}
					if v := created.Add(1); v%10000 == 0 {
						h.log("created %d other-cluster Nodes (%.0f/s)", v, float64(v)/time.Since(start).Seconds())
					}
				}
			})
		}
		wg.Go(func() {
			defer close(work)
			for _, n := range nodes {
				select {
				case work <- n:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	for i := 0; i < n; i += batch {
		envs := envtest.StartN(h.tb, min(batch, n-i), envtest.Options{GoGC: h.cfg.SmallAPIServerGOGC, Nice: h.cfg.SmallAPIServerNice,
			StartTimeout: 3 * time.Minute})
		for j, env := range envs {
			h.stops.add(func() { _ = env.Stop() })
			_, cs, err := h.clients(env)
			if err != nil {
				return nil, err
			}
			o := otherCluster{name: fmt.Sprintf("%s-%02d", Cluster, i+j+1), env: env, cs: cs}
			h.others = append(h.others, o)
			create(cs, per[i+j])
		}
		h.log("started %d of %d other API servers (%s)", len(h.others), n, time.Since(start).Round(time.Second))
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return nil, fmt.Errorf("create other clusters' Nodes: %w", err)
	}
	var out []*node
	for c, o := range h.others {
		h.res.ClusterNodes[o.name] = len(per[c])
		out = append(out, per[c]...)
	}
	h.log("created %d Nodes in %d other clusters in %s", len(out), n, time.Since(start).Round(time.Second))
	return out, nil
}

// createBackoff is how often and how long createBareNode retries an API
// server's transient answer: 7 tries over about a minute (0.5 s doubling,
// 10% jitter), as a client of a loaded API server would.
var createBackoff = wait.Backoff{Steps: 7, Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1}

// transient reports whether err is an API server answer worth retrying: a
// timeout (etcd's "request timed out" is a 500 under load), throttling,
// unavailable or an internal error.
func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err)
}

// createBareNode creates n's Node, Ready, with 8 GPUs, its zone and
// instance type, in one request, retried on a transient answer
// (createBackoff); AlreadyExists after a retry is the earlier try having
// landed. Ten minutes into the 50 API servers of the fleet scenario, one
// etcd timeout used to fail the whole setup.
func createBareNode(ctx context.Context, cs kubernetes.Interface, n *node) error {
	tries := 0
	err := retry.OnError(createBackoff, transient, func() error {
		tries++
		err := createBareNodeOnce(ctx, cs, n)
		if tries > 1 && apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("create node %s/%s (%d tries): %w", n.cluster, n.name, tries, err)
	}
	return nil
}

// createBareNodeOnce is one create request of createBareNode.
func createBareNodeOnce(ctx context.Context, cs kubernetes.Interface, n *node) error {
	gpus := resource.MustParse("8")
	now := metav1.Now()
	_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
			karpv1.NodePoolLabelKey: "gpu", corev1.LabelTopologyZone: n.zone, corev1.LabelInstanceTypeStable: "p5.48xlarge",
			corev1.LabelHostname: n.name, "nvidia.com/gpu.count": "8", "fleetrepair.dev/simulated-node": "true"}},
		Spec: corev1.NodeSpec{ProviderID: "sim:///" + n.zone + "/" + n.name},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"nvidia.com/gpu": gpus},
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": gpus},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
				Reason: "KubeletReady", LastTransitionTime: now, LastHeartbeatTime: now}},
			NodeInfo: corev1.NodeSystemInfo{KernelVersion: "6.8.0-1015-aws", OSImage: "Amazon Linux 2023"},
		},
	}, metav1.CreateOptions{})
	return err
}

// steady is the steady phase: heartbeats and background findings for
// cfg.Steady, with the controller recorded by perf in its middle when
// ProfileDir is set.
func (h *harness) steady(ctx context.Context) {
	if h.cfg.ProfileDir != "" && len(h.replicas) > 0 {
		go func() {
			sleepCtx(ctx, max(0, (h.cfg.Steady-h.cfg.ProfileFor)/2))
			h.profile(ctx, h.replicas[0])
		}()
	}
	h.background(ctx, h.cfg.Steady)
}

// profile records r with `perf record -g` for ProfileFor into
// ProfileDir/controller.perf, and writes the flat report next to it.
func (h *harness) profile(ctx context.Context, r *replica) {
	if err := os.MkdirAll(h.cfg.ProfileDir, 0o755); err != nil {
		h.log("profile: %v", err)
		return
	}
	out := filepath.Join(h.cfg.ProfileDir, "controller.perf")
	secs := strconv.Itoa(max(1, int(h.cfg.ProfileFor.Seconds())))
	rec := exec.CommandContext(ctx, "perf", "record", "-F", "199", "-g", "-p", strconv.Itoa(r.cmd.Process.Pid), "-o", out, "--", "sleep", secs)
	if b, err := rec.CombinedOutput(); err != nil {
		h.log("profile: perf record: %v: %s", err, b)
		return
	}
	rep, err := exec.CommandContext(ctx, "perf", "report", "-i", out, "--no-children", "--sort", "symbol", "--stdio", "-g", "none", "--percent-limit", "0.5").Output()
	if err != nil {
		h.log("profile: perf report: %v", err)
		return
	}
	var trimmed strings.Builder
	for _, line := range strings.Split(string(rep), "\n") {
		trimmed.WriteString(strings.TrimRight(line, " -") + "\n")
	}
	if err := os.WriteFile(filepath.Join(h.cfg.ProfileDir, "controller-report.txt"), []byte(trimmed.String()), 0o644); err != nil {
		h.log("profile: %v", err)
	}
	h.log("profile: %s (report in controller-report.txt)", out)
}

// apiServerRSS returns the RSS of env's kube-apiserver, found by its
// --secure-port in /proc.
func apiServerRSS(env *envtest.Env) (int64, error) {
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		return 0, fmt.Errorf("parse API server address %q: %w", env.Config.Host, err)
	}
	port := u.Port()
	pids, err := processes()
	if err != nil {
		return 0, err
	}
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil || !strings.Contains(string(b), "kube-apiserver") || !strings.Contains(string(b), "--secure-port="+port+"\x00") {
			continue
		}
		return rssBytes(pid)
	}
	return 0, fmt.Errorf("find the kube-apiserver of %s", env.Config.Host)
}

// recordAPIServerRSS fills Result's API server RSS figures.
func (h *harness) recordAPIServerRSS() {
	v, err := apiServerRSS(h.env)
	if err != nil {
		h.log("%v", err)
	}
	h.res.FirstAPIServerRSS = v
	for _, o := range h.others {
		v, err := apiServerRSS(o.env)
		if err != nil {
			h.log("%v", err)
		}
		h.res.SmallAPIServerRSS = max(h.res.SmallAPIServerRSS, v)
	}
}
