package envtest_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/parentdeath"
)

// TestTwoClusters starts two clusters at once and shows they are
// independent: own objects, own kubeconfig, and one can be stopped while
// the other serves on.
func TestTwoClusters(t *testing.T) {
	envs := envtest.StartN(t, 2, envtest.Options{})
	a, b := envs[0], envs[1]
	if a.Config.Host == b.Config.Host {
		t.Fatalf("both clusters at %s", a.Config.Host)
	}
	ctx := context.Background()
	if err := a.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "only-in-a"}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Client.Get(ctx, client.ObjectKey{Name: "only-in-a"}, &corev1.Node{}); !apierrors.IsNotFound(err) {
		t.Fatalf("cluster b sees cluster a's node: err = %v", err)
	}

	// The Karpenter CRDs are served in each.
	for i, e := range envs {
		var ncs karpv1.NodeClaimList
		if err := e.Client.List(ctx, &ncs); err != nil {
			t.Fatalf("cluster %d: list NodeClaims: %v", i, err)
		}
	}

	// The kubeconfig file reaches the same cluster as Config.
	cfg, err := clientcmd.BuildConfigFromFlags("", b.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := client.New(cfg, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := kc.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "via-kubeconfig"}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Client.Get(ctx, client.ObjectKey{Name: "via-kubeconfig"}, &corev1.Node{}); err != nil {
		t.Fatalf("node created through the kubeconfig: %v", err)
	}

	// Without Options.RBAC any authenticated identity may do anything.
	_, sa := a.ClientAs(t, envtest.ServiceAccount("default", "anyone"))
	if err := sa.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "only-in-a"}}); err != nil {
		t.Fatalf("impersonated delete without RBAC: %v", err)
	}

	// A cluster taken down mid-test fails its requests; the other serves on.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := a.Client.List(ctx, &corev1.NodeList{}); err == nil {
		t.Fatal("cluster a answers after Stop")
	}
	if err := b.Client.List(ctx, &corev1.NodeList{}); err != nil {
		t.Fatalf("cluster b after a stopped: %v", err)
	}
}

func TestAssetsDirNamesTheFolder(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(envtest.AssetsEnv, dir)
	_, err := envtest.AssetsDir()
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "kube-apiserver") {
		t.Fatalf("AssetsDir with an empty %s: err = %v, want it to name the binary and %s", envtest.AssetsEnv, err, dir)
	}
}

// TestGoGC: with Options.GoGC the cluster works and its kube-apiserver
// runs with that GOGC in its environment (the wrapper script execs it).
func TestGoGC(t *testing.T) {
	env := envtest.Start(t, envtest.Options{GoGC: 25})
	if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gogc"}}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), "--secure-port="+u.Port()+"\x00") {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if err != nil {
			t.Fatalf("read the API server's environment: %v", err)
		}
		if !strings.Contains("\x00"+string(environ), "\x00GOGC=25\x00") {
			t.Fatalf("kube-apiserver (pid %s) runs without GOGC=25", d.Name())
		}
		if !strings.HasSuffix(strings.SplitN(string(cmdline), "\x00", 2)[0], "/kube-apiserver") {
			t.Fatalf("process %s is %q, want kube-apiserver itself (the wrapper execs it)", d.Name(), cmdline)
		}
		return
	}
	t.Fatalf("no kube-apiserver process serves port %s", u.Port())
}

// clusterHelperEnv makes TestClusterHelperProcess the helper of
// TestClusterDiesWithTest.
const clusterHelperEnv = "ENVTEST_TEST_CLUSTER_HELPER"

// TestClusterHelperProcess starts a cluster, prints the PIDs of its etcd
// and kube-apiserver and waits to be killed.
func TestClusterHelperProcess(t *testing.T) {
	if os.Getenv(clusterHelperEnv) == "" {
		t.Skip("run by TestClusterDiesWithTest")
	}
	envtest.Start(t, envtest.Options{})
	self := strconv.Itoa(os.Getpid())
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		exe, _ := os.Readlink(filepath.Join("/proc", d.Name(), "exe"))
		if len(f) > 1 && f[1] == self && (filepath.Base(exe) == "etcd" || filepath.Base(exe) == "kube-apiserver") {
			fmt.Printf("child %s %s\n", filepath.Base(exe), d.Name())
		}
	}
	fmt.Println("started")
	time.Sleep(10 * time.Minute)
}

// TestClusterDiesWithTest SIGKILLs a test process that runs a cluster, so
// no cleanup runs, and checks that its etcd and kube-apiserver die with it.
func TestClusterDiesWithTest(t *testing.T) {
	helper, sc := parentdeath.Helper(t, "TestClusterHelperProcess", clusterHelperEnv)
	children := map[string]int{}
	for sc.Scan() && sc.Text() != "started" {
		var name string
		var pid int
		if _, err := fmt.Sscanf(sc.Text(), "child %s %d", &name, &pid); err == nil {
			children[name] = pid
		}
	}
	if children["etcd"] == 0 || children["kube-apiserver"] == 0 {
		t.Fatalf("the helper reported children %v, want etcd and kube-apiserver (scan: %v)", children, sc.Err())
	}
	for _, pid := range children {
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for name, pid := range children {
		for running(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) outlived the test process that started it by 60 s", name, pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// running reports whether pid exists and is not a zombie (a container's
// init may never reap it).
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}
