package kubeapi

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/envtest"
)

// chartCases are the value sets the chart is rendered and applied with.
var chartCases = []struct {
	name   string
	values string
	// kinds is the exact multiset of rendered kinds, sorted.
	kinds []string
}{
	{
		name:   "defaults",
		values: baseValues,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "Deployment", "Job", "PodDisruptionBudget",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount"},
	},
	{
		name: "everything",
		values: baseValues + `  dryRun: true
  policy:
    reasons:
      GPUHang: {toleration: 5m, action: replace}
  extraClusters:
    - {name: west, secretName: fleetrepair-kubeconfig-west}
  podAnnotations: {team: gpu-platform}
agent:
  nodeSelector: {nvidia.com/gpu.present: "true"}
serviceMonitor: {enabled: true}
prometheusRule: {enabled: true}
`,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "PodDisruptionBudget",
			"PodMonitor", "PrometheusRule", "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount", "ServiceMonitor"},
	},
	{
		// A cluster another cluster's controller manages: agents and the
		// controller's identity and RBAC only.
		name: "remote-cluster",
		values: `
clusterName: c2
controller: {enabled: false}
agent: {controllerURL: "https://fleetrepair.example.com"}
serviceMonitor: {enabled: true}
`,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "PodMonitor", "Role", "RoleBinding",
			"ServiceAccount", "ServiceAccount"},
	},
}

// TestChart renders deploy/chart with the real helm for several value sets,
// lints it, checks what the workloads must carry, and applies every object
// to a real API server with server-side dry-run (server-side apply, which
// types every field against the schema), so the API server's schema and admission judge the
// result. Objects of the Prometheus Operator (ServiceMonitor, PodMonitor,
// PrometheusRule) are skipped with a note when their CRDs are absent, as
// they are here. The namespace warns on the restricted Pod Security
// Standard: the controller and the migration Job meet it; the agent, which
// needs /dev/kmsg and CAP_SYSLOG, is the one workload that may not.
func TestChart(t *testing.T) {
	envtest.Tool(t, "helm") // skip early, before starting an API server
	env := envtest.Start(t, envtest.Options{RBAC: true})
	createNamespace(t, env, map[string]string{"pod-security.kubernetes.io/warn": "restricted"})
	flags := binaryFlags(t)

	for _, tc := range chartCases {
		t.Run(tc.name, func(t *testing.T) {
			vf := valuesFile(t, tc.values)
			if out, err := helm(t, "lint", "--strict", chartDir(t), "--namespace", namespace, "--values", vf); err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
			objs, err := render(t, tc.values)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetKind())
				if ns := o.GetNamespace(); ns != "" && ns != namespace {
					t.Errorf("%s %s in namespace %q, want %q", o.GetKind(), o.GetName(), ns, namespace)
				}
			}
			slices.Sort(kinds)
			if !slices.Equal(kinds, tc.kinds) {
				t.Fatalf("rendered kinds = %v, want %v", kinds, tc.kinds)
			}
			checkFlags(t, objs, flags)
			checkAgent(t, objs)
			if find(objs, "Deployment", "fleetrepair-controller") != nil {
				checkController(t, objs)
			}
			applyDryRun(t, env, objs)
		})
	}

	t.Run("RequiredValues", func(t *testing.T) {
		for _, c := range []struct{ values, want string }{
			{"controller: {database: {existingSecret: db}}", "clusterName is required"},
			{"clusterName: c1", "controller.database.existingSecret is required"},
			{"clusterName: c1\ncontroller: {enabled: false}", "agent.controllerURL is required"},
		} {
			if _, err := render(t, c.values); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("values %q: err = %v, want it to say %q", c.values, err, c.want)
			}
		}
	})
}

// checkAgent checks the agent DaemonSet: the kernel log, CAP_SYSLOG, the
// node's name from the downward API, and the projected fleetrepair token as
// its only credential.
func checkAgent(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ds := typed[appsv1.DaemonSet](t, find(objs, "DaemonSet", "fleetrepair-agent"))
	pod := ds.Spec.Template.Spec
	if pod.ServiceAccountName != agentSA || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("agent: serviceAccount %q automount %v, want %s without an API token", pod.ServiceAccountName, pod.AutomountServiceAccountToken, agentSA)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool { return tol.Operator == corev1.TolerationOpExists && tol.Key == "" }) {
		t.Errorf("agent tolerations %v: it must run on quarantined and GPU-tainted nodes", pod.Tolerations)
	}
	var kmsg, token bool
	for _, v := range pod.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/dev/kmsg" && v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathCharDev {
			kmsg = true
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				token = token || src.ServiceAccountToken != nil && src.ServiceAccountToken.Audience == "fleetrepair"
			}
		}
	}
	if !kmsg || !token {
		t.Errorf("agent volumes: /dev/kmsg hostPath %v, projected fleetrepair-audience token %v", kmsg, token)
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SYSLOG"}) ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("agent security context = %+v, want CAP_SYSLOG only and a read-only root", sc)
	}
	var nodeName bool
	for _, e := range c.Env {
		nodeName = nodeName || e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}
	if !nodeName {
		t.Errorf("agent env %v: want NODE_NAME from spec.nodeName", c.Env)
	}
	if !slices.Contains(c.Args, "--token-file=/var/run/secrets/fleetrepair/token") {
		t.Errorf("agent args %v: want the projected token file", c.Args)
	}
	if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Errorf("agent has a CPU limit: throttling would add jitter to the node's jobs")
	}
}

// checkController checks the controller Deployment, its Service and the
// migration Job.
func checkController(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	d := typed[appsv1.Deployment](t, find(objs, "Deployment", "fleetrepair-controller"))
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("controller replicas = %v, want 2", d.Spec.Replicas)
	}
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	for _, arg := range []string{"controller", "--cluster=c1=in-cluster", "--leader-elect", "--leader-elect-namespace=$(POD_NAMESPACE)",
		"--leader-elect-identity=$(POD_NAME)", "--agent-auth=tokenreview", "--agent-audience=fleetrepair",
		"--agent-service-account=system:serviceaccount:fleetrepair:fleetrepair-agent"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("controller args %v: missing %s", c.Args, arg)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["DATABASE_URL"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "fleetrepair-db" {
		t.Errorf("controller DATABASE_URL = %+v, want it from Secret fleetrepair-db", e)
	}
	if e := env["POD_NAMESPACE"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("controller POD_NAMESPACE = %+v", e)
	}
	if pod.ServiceAccountName != controllerSA {
		t.Errorf("controller serviceAccount = %q", pod.ServiceAccountName)
	}
	svc := typed[corev1.Service](t, find(objs, "Service", "fleetrepair-controller"))
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8080 {
		t.Errorf("controller Service ports = %+v", svc.Spec.Ports)
	}
	job := typed[batchv1.Job](t, find(objs, "Job", "fleetrepair-migrate"))
	if job.Annotations["helm.sh/hook"] != "pre-install,pre-upgrade" || !slices.Equal(job.Spec.Template.Spec.Containers[0].Args, []string{"migrate", "up"}) {
		t.Errorf("migration Job: hook %q args %v", job.Annotations["helm.sh/hook"], job.Spec.Template.Spec.Containers[0].Args)
	}
}

// warnings collects the API server's warnings (Pod Security among them).
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	w.msgs = append(w.msgs, text)
	w.mu.Unlock()
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.msgs
	w.msgs = nil
	return out
}

// applyDryRun applies every object with server-side apply and dry-run,
// skipping (with a note) kinds whose API the server does not serve. Only
// the agent DaemonSet may draw Pod Security warnings.
func applyDryRun(t *testing.T, env *envtest.Env, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	w := &warnings{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandlerWithContext = w
	c, err := client.New(cfg, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		if _, err := c.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); meta.IsNoMatchError(err) {
			t.Logf("note: %s %s not applied: the API server does not serve %s (install the Prometheus Operator CRDs to apply it)",
				gvk.Kind, o.GetName(), gvk.GroupVersion())
			continue
		} else if err != nil {
			t.Fatalf("map %s: %v", gvk, err)
		}
		// Server-side apply types the object against the API server's
		// schema: an unknown or misplaced field is an error, not dropped.
		err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.DryRunAll,
			client.ForceOwnership, client.FieldOwner("fleetrepair-chart-test"))
		if err != nil {
			t.Errorf("server-side dry-run apply of %s %s: %v", gvk.Kind, o.GetName(), err)
			continue
		}
		applied++
		// The pod each workload makes goes through the pod admission
		// plugins (Pod Security, Priority) and pod validation as well.
		if pod := podOf(t, o); pod != nil {
			if err := c.Create(ctx, pod, client.DryRunAll); err != nil {
				t.Errorf("dry-run create of the pod of %s %s: %v", gvk.Kind, o.GetName(), err)
			}
		}
		if msgs := w.take(); len(msgs) > 0 {
			if o.GetKind() != "DaemonSet" {
				t.Errorf("%s %s drew warnings: %v", gvk.Kind, o.GetName(), msgs)
			} else {
				t.Logf("agent DaemonSet, expected Pod Security warnings (restricted): %s", strings.Join(msgs, "; "))
			}
		}
	}
	if applied == 0 {
		t.Fatal("nothing applied")
	}
	// A dry run persists nothing.
	var ds appsv1.DaemonSetList
	if err := env.Client.List(ctx, &ds, client.InNamespace(namespace)); err != nil || len(ds.Items) != 0 {
		t.Fatalf("DaemonSets after a dry run: %d, %v", len(ds.Items), err)
	}
	t.Logf("applied %d of %d objects with server-side dry-run", applied, len(objs))
}

// binaryFlags builds the two binaries and returns, per image, the flags
// their command accepts ("--name"), from `--help`.
func binaryFlags(t *testing.T) map[string]string {
	t.Helper()
	root, err := envtest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/fleetrepair", "./cmd/fleetrepair-agent")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build binaries: %v\n%s", err, out)
	}
	help := func(bin string, args ...string) string {
		out, err := exec.Command(filepath.Join(dir, bin), append(args, "--help")...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v --help: %v\n%s", bin, args, err, out)
		}
		return string(out)
	}
	return map[string]string{
		"controller": help("fleetrepair", "controller"),
		"migrate":    help("fleetrepair", "migrate"),
		"agent":      help("fleetrepair-agent", "run"),
	}
}

// checkFlags checks that every flag the chart passes is one the binary's
// command defines, so the chart and the CLI cannot drift apart unnoticed.
func checkFlags(t *testing.T, objs []*unstructured.Unstructured, help map[string]string) {
	t.Helper()
	check := func(what string, args []string) {
		for _, a := range args {
			if !strings.HasPrefix(a, "--") {
				continue
			}
			name, _, _ := strings.Cut(a, "=")
			if !strings.Contains(help[what], " "+name+" ") && !strings.Contains(help[what], " "+name+"\n") {
				t.Errorf("%s: the chart passes %s, which `%s --help` does not list", what, name, what)
			}
		}
	}
	if u := find(objs, "Deployment", "fleetrepair-controller"); u != nil {
		check("controller", typed[appsv1.Deployment](t, u).Spec.Template.Spec.Containers[0].Args)
	}
	if u := find(objs, "Job", "fleetrepair-migrate"); u != nil {
		check("migrate", typed[batchv1.Job](t, u).Spec.Template.Spec.Containers[0].Args)
	}
	if u := find(objs, "DaemonSet", "fleetrepair-agent"); u != nil {
		check("agent", typed[appsv1.DaemonSet](t, u).Spec.Template.Spec.Containers[0].Args)
	}
}

// podOf returns the pod a workload would create (on a node, for the
// DaemonSet), or nil for other objects.
func podOf(t *testing.T, o *unstructured.Unstructured) *corev1.Pod {
	t.Helper()
	var tmpl corev1.PodTemplateSpec
	switch o.GetKind() {
	case "Deployment":
		tmpl = typed[appsv1.Deployment](t, o).Spec.Template
	case "DaemonSet":
		tmpl = typed[appsv1.DaemonSet](t, o).Spec.Template
		tmpl.Spec.NodeName = "node-1"
	case "Job":
		tmpl = typed[batchv1.Job](t, o).Spec.Template
	default:
		return nil
	}
	pod := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	pod.Name, pod.Namespace = o.GetName()+"-pod", namespace
	return pod
}
