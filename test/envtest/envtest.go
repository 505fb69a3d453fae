// Package envtest starts real Kubernetes API servers for tests: a
// kube-apiserver and its etcd, started by controller-runtime's envtest from
// the binaries `make kube-tools` builds into .tools/kube, with the Karpenter
// CRDs (NodeClaims, NodePools, NodeOverlays, CapacityBuffers) of the
// sigs.k8s.io/karpenter module installed.
//
// Each Start is an independent cluster (own etcd, own ports, own
// certificates), so a test that needs two clusters starts two. Nothing else
// runs: no controller-manager, no scheduler, no kubelet, so no garbage
// collection, no namespace finalization and no ServiceAccount token
// controller; a test plays those parts itself (test/karpentersim plays
// Karpenter's).
//
// The binaries are looked up in KUBEBUILDER_ASSETS when it is set, else in
// .tools/kube under the fleetrepair module root. When they are absent the
// test fails with a message naming `make kube-tools` (no silent skip: make
// test needs them, and .ci/run builds them). Starting one environment takes
// 3–4 s on an idle machine and about 300 MiB of memory.
//
// etcd and kube-apiserver die with the test process however it ends
// (SIGTERM, Ctrl-C, go test -timeout, SIGKILL), not only through Stop: each
// is started through a test/parentdeath wrapper, which gives it SIGKILL as
// its parent-death signal. A test ended that way leaves etcd's data and
// certificate folders in the system temp folder; Stop removes them.
package envtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"
	karpapis "sigs.k8s.io/karpenter/pkg/apis"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/parentdeath"
)

// ModulePath is the fleetrepair module path; its go.mod marks the root that
// .tools/kube is found under.
const ModulePath = "github.com/fleetrepair/fleetrepair"

// AssetsEnv names the folder holding kube-apiserver and etcd (envtest's
// variable); it wins over .tools/kube.
const AssetsEnv = "KUBEBUILDER_ASSETS"

// Options configures an environment. The zero value is a cluster with the
// Karpenter CRDs in which every authenticated identity may do anything.
type Options struct {
	// RBAC makes authorization real: the API server authorizes with RBAC
	// (--authorization-mode=RBAC), the admin identity (Config, Client) is in
	// system:masters and may do anything, and any other identity,
	// impersonated with ClientAs, holds only what Roles and ClusterRoles
	// grant it. Off, every authenticated identity is bound to cluster-admin,
	// so permissions are never in question. (The API server still runs
	// RBAC then: with --authorization-mode=AlwaysAllow it refuses anonymous
	// requests, and envtest's readiness probe is one.)
	RBAC bool
	// CRDs are installed after the Karpenter CRDs.
	CRDs []*apiextensionsv1.CustomResourceDefinition
	// APIServerArgs are extra kube-apiserver flags, by name without the
	// leading dashes (e.g. "api-audiences": {"fleetrepair"}). They replace
	// envtest's value for the same flag.
	APIServerArgs map[string][]string
	// StartTimeout bounds the start of etcd and of kube-apiserver, each
	// (default: KUBEBUILDER_CONTROLPLANE_START_TIMEOUT, else 60s: a loaded
	// 2-core machine needs more than envtest's 20s).
	StartTimeout time.Duration
	// GoGC, when > 0, is the Go garbage collector's GOGC of the
	// kube-apiserver process: with 25 an idle API server holds about 215
	// MiB of RSS instead of 265 MiB, at no idle CPU this machine can
	// measure (under 0.03 cores either way), which is what lets test/load
	// run 50 clusters on one machine. (A GOMEMLIMIT of 100 MiB, near the
	// live heap, gave 190 MiB but 0.3 cores of idle garbage collection.)
	GoGC int
	// Nice, when 1 to 19, runs kube-apiserver and etcd at that niceness
	// (test/parentdeath NiceEnv): the Linux scheduler then gives them the
	// CPU only after the processes at niceness 0. test/load runs its 49
	// small simulated clusters so: idle, each API server and etcd pair takes
	// about 0.025 cores, 1.2 of the 2 cores together, which starved the
	// controller under measurement (docs/scale.md, "The 100,000-node runs
	// (session 7)").
	Nice int
}

// Env is one running cluster. Its fields are read-only.
type Env struct {
	// Config is the admin's REST config (system:masters).
	Config *rest.Config
	// Client is a controller-runtime client for the admin with kube.Scheme
	// (core types and the Karpenter v1 types).
	Client client.Client
	// Kubeconfig is the path of a kubeconfig file for the admin, in a
	// temporary folder removed at the end of the test.
	Kubeconfig string
	// AssetsDir is the folder kube-apiserver and etcd were started from.
	AssetsDir string

	env        *crenvtest.Environment
	wrapperDir string // the parent-death wrappers' folder, removed by Stop
	stopOnce   sync.Once
	stopErr    error
}

// Start starts one cluster and stops it when the test ends (t.Cleanup). It
// fails the test when the binaries are absent (naming `make kube-tools`) or
// when the cluster does not start.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	return StartN(t, 1, o)[0]
}

// StartN starts n independent clusters at once (in parallel, which halves
// the wait for two) and stops them all when the test ends.
func StartN(t testing.TB, n int, o Options) []*Env {
	t.Helper()
	dir, err := AssetsDir()
	if err != nil {
		t.Fatalf("no kube-apiserver and etcd to start (%v): build them with `make kube-tools` (make test needs them; .ci/run builds them)", err)
	}
	envs := make([]*Env, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range envs {
		wg.Go(func() { envs[i], errs[i] = start(dir, o) })
	}
	wg.Wait()
	for _, e := range envs {
		if e != nil {
			t.Cleanup(func() {
				if err := e.Stop(); err != nil {
					t.Errorf("stop envtest cluster: %v", err)
				}
			})
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("start envtest cluster: %v", err)
	}
	for _, e := range envs {
		path := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(path, e.env.KubeConfig, 0o600); err != nil {
			t.Fatalf("write kubeconfig: %v", err)
		}
		e.Kubeconfig = path
	}
	return envs
}

// start starts one cluster from the binaries in dir. On error the returned
// Env, when not nil, holds what started and must be stopped.
func start(dir string, o Options) (*Env, error) {
	te := &crenvtest.Environment{
		Scheme:                   kube.Scheme,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: o.StartTimeout,
	}
	if te.ControlPlaneStartTimeout == 0 && os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		te.ControlPlaneStartTimeout = 60 * time.Second
	}
	// Installing the CRDs waits for them to be served; envtest's 10 s is
	// not enough for an API server started next to dozens of others
	// (test/load's fleet scenario).
	te.CRDInstallOptions.MaxTime = max(te.ControlPlaneStartTimeout, 10*time.Second)
	// Each cluster gets its own copy: envtest edits the CRDs it installs,
	// and the karpenter package's slice is shared by every caller.
	for _, crd := range karpapis.CRDs {
		te.CRDs = append(te.CRDs, crd.DeepCopy())
	}
	for _, crd := range o.CRDs {
		te.CRDs = append(te.CRDs, crd.DeepCopy())
	}
	// etcd and kube-apiserver die with the test process however it ends
	// (test/parentdeath): envtest starts them in their own process group
	// and sets no parent-death signal, so a test killed before its
	// cleanups left both running under init.
	wrapperDir, err := os.MkdirTemp("", "envtest-bin-")
	if err != nil {
		return nil, fmt.Errorf("write etcd and kube-apiserver wrappers: %w", err)
	}
	var apiEnv []string
	if o.GoGC > 0 {
		apiEnv = append(apiEnv, "GOGC="+strconv.Itoa(o.GoGC))
	}
	var etcdEnv []string
	if o.Nice > 0 {
		apiEnv = append(apiEnv, parentdeath.NiceEnv+"="+strconv.Itoa(o.Nice))
		etcdEnv = append(etcdEnv, parentdeath.NiceEnv+"="+strconv.Itoa(o.Nice))
	}
	apiPath, err := parentdeath.Wrapper(wrapperDir, filepath.Join(dir, "kube-apiserver"), apiEnv...)
	if err != nil {
		_ = os.RemoveAll(wrapperDir)
		return nil, err
	}
	etcdPath, err := parentdeath.Wrapper(wrapperDir, filepath.Join(dir, "etcd"), etcdEnv...)
	if err != nil {
		_ = os.RemoveAll(wrapperDir)
		return nil, err
	}
	api := te.ControlPlane.GetAPIServer()
	api.Path = apiPath
	te.ControlPlane.Etcd = &crenvtest.Etcd{Path: etcdPath}
	args := api.Configure()
	args.Set("authorization-mode", "RBAC")
	// Stop waits at most 2 s for open watches (an informer's watch has no
	// client-side timeout: controller/kube cache.go); without it the API
	// server's graceful shutdown outlasts envtest's 20 s stop timeout while
	// a client still watches, as in a test that takes a cluster down under
	// a running controller.
	args.Set("shutdown-watch-termination-grace-period", "2s")
	for name, vals := range o.APIServerArgs {
		args.Set(name, vals...)
	}
	cfg, err := te.Start()
	if err != nil {
		_ = te.Stop()
		_ = os.RemoveAll(wrapperDir)
		return nil, fmt.Errorf("start kube-apiserver from %s: %w", dir, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: kube.Scheme})
	e := &Env{Config: cfg, Client: c, AssetsDir: dir, env: te, wrapperDir: wrapperDir}
	if err != nil {
		return e, fmt.Errorf("build client: %w", err)
	}
	if !o.RBAC {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "envtest:authenticated-cluster-admin"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:authenticated"}},
		}
		if err := c.Create(context.Background(), crb); err != nil {
			return e, fmt.Errorf("bind authenticated users to cluster-admin: %w", err)
		}
	}
	return e, nil
}

// Stop stops the cluster's kube-apiserver and etcd and removes etcd's data.
// It is idempotent; Start registers it with t.Cleanup, and a test calls it
// itself to take a cluster down mid-test.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		if err := e.env.Stop(); err != nil {
			e.stopErr = fmt.Errorf("stop kube-apiserver and etcd: %w", err)
		}
		_ = os.RemoveAll(e.wrapperDir)
	})
	return e.stopErr
}

// ClientAs returns a REST config and a client (kube.Scheme) that act as
// another identity through impersonation: the admin authenticates, and the
// API server authorizes every request against the impersonated user and
// groups (see ServiceAccount). With Options.RBAC that identity holds only
// what RBAC grants it.
func (e *Env) ClientAs(t testing.TB, who rest.ImpersonationConfig) (*rest.Config, client.Client) {
	t.Helper()
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = who
	c, err := client.New(cfg, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatalf("build impersonating client for %s: %v", who.UserName, err)
	}
	return cfg, c
}

// ServiceAccount is the identity a pod running as the ServiceAccount
// namespace/name presents: its user name and the groups the API server
// gives every ServiceAccount token.
func ServiceAccount(namespace, name string) rest.ImpersonationConfig {
	return rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
}

// AssetsDir returns the folder holding kube-apiserver and etcd:
// KUBEBUILDER_ASSETS when set, else .tools/kube under the module root
// (found from the working directory upward). It returns an error naming the
// folder it looked in when either binary is missing.
func AssetsDir() (string, error) {
	dir := os.Getenv(AssetsEnv)
	if dir == "" {
		root, err := ModuleRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, ".tools", "kube")
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("find %s in %s: %w", name, dir, err)
		}
		if fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("find %s in %s: not executable", name, dir)
		}
	}
	return dir, nil
}

// Tool returns the path of another binary `make kube-tools` builds (helm)
// from the folder kube-apiserver is found in, else from .tools/kube, and
// fails the test, naming `make kube-tools`, when there is none.
func Tool(t testing.TB, name string) string {
	t.Helper()
	var dirs []string
	if dir, err := AssetsDir(); err == nil {
		dirs = append(dirs, dir)
	}
	if root, err := ModuleRoot(); err == nil {
		dirs = append(dirs, filepath.Join(root, ".tools", "kube"))
	}
	for _, dir := range dirs {
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err == nil && fi.Mode()&0o111 != 0 {
			return path
		}
	}
	t.Fatalf("no %s in %v: build it with `make kube-tools` (make test needs it; .ci/run builds it)", name, dirs)
	return ""
}

// ModuleRoot returns the fleetrepair module's root folder: the nearest
// folder at or above the working directory whose go.mod declares
// ModulePath (a test runs in its package's folder).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && declaresModule(string(b)) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find module root: no go.mod for %s at or above the working directory", ModulePath)
		}
		dir = parent
	}
}

func declaresModule(gomod string) bool {
	for _, line := range strings.Split(gomod, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == ModulePath {
			return true
		}
	}
	return false
}

// WaitFor polls cond every 50ms until it returns true or an error, or until
// timeout, and fails the test on error or timeout. It is for state another
// goroutine (a simulated controller) brings about; what a test does itself
// it checks directly.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil {
			t.Fatalf("wait for %s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("wait for %s: not within %s", what, timeout)
		case <-tick.C:
		}
	}
}
