package kubeapi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/envtest"
)

// promOpAPI makes helm render the Prometheus Operator objects, as it does
// against a cluster serving monitoring.coreos.com/v1 (the chart's
// Capabilities guard).
var promOpAPI = []string{"--api-versions", "monitoring.coreos.com/v1"}

// chartCases are the value sets the chart is rendered and installed with.
var chartCases = []struct {
	name   string
	values string
	// helm are extra `helm template` flags.
	helm []string
	// needFlags are flags a binary must define for the case to run
	// ("controller --tls-cert-file"): values that map to flags another branch
	// adds; the case is skipped, naming the flag, until they exist.
	needFlags []string
	// kinds is the exact multiset of rendered kinds, sorted.
	kinds []string
	// unprivileged: the values set agent.privileged=false.
	unprivileged bool
}{
	{
		name:   "defaults",
		values: baseValues,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount"},
	},
	{
		// Monitoring enabled on a cluster without the Prometheus Operator
		// CRDs: the guard leaves the objects out instead of failing.
		name:   "monitoring-without-crds",
		values: baseValues + "serviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n",
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount"},
	},
	{
		name: "everything",
		values: baseValues + `  dryRun: false
  operators: {existingSecret: fleetrepair-operators}
  policy:
    reasons:
      GPUHang: {toleration: 5m, action: replace}
  extraClusters:
    - {name: west, secretName: fleetrepair-kubeconfig-west}
  podAnnotations: {team: gpu-platform}
  findingRetention: 2160h
  findingCompaction: false
networkPolicy:
  egress: {enabled: true, to: [{ipBlock: {cidr: 10.0.0.0/8}}]}
agent:
  nodeSelector: {nvidia.com/gpu.present: "true"}
  dcgm: {mode: local}
  image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
serviceMonitor: {enabled: true}
prometheusRule: {enabled: true}
`,
		helm: promOpAPI,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
			"PodMonitor", "PrometheusRule", "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount", "ServiceMonitor"},
	},
	{
		// The controller configuration: label cohorts and timings from
		// controller.config, over the convenience values.
		name: "config",
		values: baseValues + `  budgets: {deletionsPerHour: 4, nodePoolDeletionsPerHour: 2, maxInFlightPerNodePool: 1}
  config:
    breaker: {labels: [topology.kubernetes.io/rack, nvidia.com/gpu.clique]}
    budgets: {minHealthy: 2}
    repair: {approvalTTL: 12h}
`,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount"},
	},
	{
		// A node pool without the NVIDIA toolkit and without DCGM.
		name: "no-nvidia-runtime",
		values: baseValues + `agent:
  runtimeClassName: ""
  dcgm: {mode: disabled}
  stuckProcess: {enabled: false}
  criSocket: ""
  kubeletHealthz: ""
`,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount"},
	},
	{
		// The operator's opt-out: the agent unprivileged, with CAP_SYSLOG
		// and CAP_SYS_PTRACE only.
		name:         "unprivileged-agent",
		values:       baseValues + "agent: {privileged: false}\n",
		unprivileged: true,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount"},
	},
	{
		name: "tls-cert-manager",
		values: baseValues + `  tls:
    enabled: true
    certManager: {enabled: true, issuerRef: {name: internal-ca, kind: ClusterIssuer}}
serviceMonitor: {enabled: true}
`,
		helm:      promOpAPI,
		needFlags: []string{"controller --tls-cert-file", "controller --tls-key-file", "agent --ca-file"},
		kinds: []string{"Certificate", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
			"PodMonitor", "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount", "ServiceMonitor"},
	},
	{
		name: "oidc",
		values: baseValues + `  oidc:
    enabled: true
    issuerURL: https://login.example.com
    clientID: fleetrepair
    clientSecret: {existingSecret: fleetrepair-oidc}
    roles: {gpu-oncall: approver}
`,
		needFlags: []string{"controller --oidc-issuer-url", "controller --oidc-client-id", "controller --oidc-groups-claim", "controller --oidc-role"},
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job", "NetworkPolicy", "PodDisruptionBudget",
			"Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount"},
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
		helm: promOpAPI,
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "PodMonitor", "Role", "RoleBinding",
			"ServiceAccount", "ServiceAccount"},
	},
	{
		// The same, trusting the controller's CA from a Secret.
		name: "remote-cluster-ca",
		values: `
clusterName: c2
controller: {enabled: false}
agent: {controllerURL: "https://fleetrepair.example.com", caSecret: fleetrepair-ca}
`,
		needFlags: []string{"agent --ca-file"},
		kinds: []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role", "RoleBinding",
			"ServiceAccount", "ServiceAccount"},
	},
}

// TestChart renders deploy/chart with the real helm for several value sets,
// lints it, checks what the workloads must carry, and installs every object
// on a real API server (server-side apply, which types every field against
// the schema) with the Karpenter CRDs, stand-ins for the Prometheus Operator
// and cert-manager CRDs and the nvidia RuntimeClass the GPU Operator
// creates; each workload's pod goes through pod admission with a dry-run
// create. The namespace warns on the restricted Pod Security Standard: the
// controller and the migration Job meet it; the agent, which needs
// /dev/kmsg, host paths and CAP_SYSLOG, is the one workload that may not.
func TestChart(t *testing.T) {
	envtest.Tool(t, "helm") // skip early, before starting an API server
	env := envtest.Start(t, envtest.Options{RBAC: true, CRDs: standInCRDs()})
	createNamespace(t, env, map[string]string{"pod-security.kubernetes.io/warn": "restricted"})
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "nvidia"}
	if err := env.Client.Create(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	flags := binaryFlags(t)

	for _, tc := range chartCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, nf := range tc.needFlags {
				bin, flag, _ := strings.Cut(nf, " ")
				if !hasFlag(flags[bin], flag) {
					t.Fatalf("%s does not define %s, which these chart values pass to it", bin, flag)
				}
			}
			vf := valuesFile(t, tc.values)
			if out, err := helm(t, "lint", "--strict", chartDir(t), "--namespace", namespace, "--values", vf); err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
			objs, err := render(t, tc.values, tc.helm...)
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
			if find(objs, "DaemonSet", "fleetrepair-agent") != nil {
				checkAgent(t, objs, !tc.unprivileged)
			}
			if find(objs, "Deployment", "fleetrepair-controller") != nil {
				checkController(t, objs)
				checkNetworkPolicy(t, objs)
			}
			install(t, env, objs)
		})
	}

	t.Run("RequiredValues", func(t *testing.T) {
		for _, c := range []struct{ values, want string }{
			{"controller: {database: {existingSecret: db}}", "clusterName is required"},
			{"clusterName: c1", "controller.database.existingSecret is required"},
			{"clusterName: c1\ncontroller: {enabled: false}", "agent.controllerURL is required"},
			{baseValues + "  tls: {enabled: true}\n", "controller.tls.existingSecret (or controller.tls.certManager.enabled) is required"},
		} {
			if _, err := render(t, c.values); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("values %q: err = %v, want it to say %q", c.values, err, c.want)
			}
		}
	})

	// The findings' retention and compaction reach the controller as its
	// flags, defaults included, and a value that is not a duration or a
	// boolean fails the install.
	t.Run("FindingHistory", func(t *testing.T) {
		for _, c := range []struct {
			values string
			want   []string
		}{
			{baseValues, []string{"--finding-retention=720h", "--finding-compaction=true"}},
			{baseValues + "  findingCompaction: false\n  findingRetention: 168h\n", []string{"--finding-retention=168h", "--finding-compaction=false"}},
			{baseValues + "  findingRetention: \"0\"\n", []string{"--finding-retention=0", "--finding-compaction=true"}},
		} {
			objs, err := render(t, c.values)
			if err != nil {
				t.Fatalf("values %q: %v", c.values, err)
			}
			args := typed[appsv1.Deployment](t, find(objs, "Deployment", "fleetrepair-controller")).Spec.Template.Spec.Containers[0].Args
			for _, w := range c.want {
				if !slices.Contains(args, w) {
					t.Errorf("values %q: controller args %v, want %s", c.values, args, w)
				}
			}
			checkFlags(t, objs, flags)
		}
		for _, bad := range []string{"  findingCompaction: \"no\"\n", "  findingRetention: 30d\n"} {
			if _, err := render(t, baseValues+bad); err == nil {
				t.Errorf("values %q rendered; want the schema to refuse them", bad)
			}
		}
	})

	// Leader election and its Lease timings: what the chart renders reaches
	// the controller's flags; what the controller would refuse (or two
	// replicas without election) stops helm, naming the value.
	t.Run("LeaderElection", func(t *testing.T) {
		objs, err := render(t, baseValues+"  leaderElection: {enabled: true, leaseDuration: 5s, renewDeadline: 3s, retryPeriod: 1s}\n")
		if err != nil {
			t.Fatal(err)
		}
		args := typed[appsv1.Deployment](t, find(objs, "Deployment", "fleetrepair-controller")).Spec.Template.Spec.Containers[0].Args
		for _, w := range []string{"--leader-elect-lease-duration=5s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=1s"} {
			if !slices.Contains(args, w) {
				t.Errorf("controller args %v, want %s", args, w)
			}
		}
		if _, err := render(t, baseValues+"  replicas: 1\n  leaderElection: {enabled: false}\n"); err != nil {
			t.Errorf("one replica without leader election: %v", err)
		}
		for bad, want := range map[string]string{
			"  leaderElection: {enabled: false}\n":                                          "turn leader election on or set replicas to 1",
			"  leaderElection: {leaseDuration: 5s}\n":                                       "renewDeadline 10s: want less than leaseDuration (5s)",
			"  leaderElection: {retryPeriod: 9s}\n":                                         "retryPeriod 9s: want renewDeadline (10s) more than 1.2 times it",
			"  leaderElection: {retryPeriod: 0s}\n":                                         "retryPeriod",
			"  leaderElection: {leaseDuration: 1500ms}\n":                                   "leaseDuration",
			"  leaderElection: {leaseDuration: 20s, renewDeadline: 20s, retryPeriod: 2s}\n": "renewDeadline 20s",
		} {
			if _, err := render(t, baseValues+bad); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("values %q: %v; want helm to refuse them with %q", bad, err, want)
			}
		}
	})

	// The controller's memory limit is also the Go runtime's soft limit
	// (GOMEMLIMIT from the container's limits.memory), and a chart without
	// a limit sets none.
	t.Run("MemoryLimit", func(t *testing.T) {
		for _, c := range []struct {
			values string
			limit  string // "": no GOMEMLIMIT
		}{
			{baseValues, "2Gi"},
			{baseValues + "  resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {memory: 4Gi}}\n", "4Gi"},
			{baseValues + "  resources: {limits: null}\n", ""}, // helm merges maps: null drops the default limit
		} {
			objs, err := render(t, c.values)
			if err != nil {
				t.Fatalf("values %q: %v", c.values, err)
			}
			ctr := typed[appsv1.Deployment](t, find(objs, "Deployment", "fleetrepair-controller")).Spec.Template.Spec.Containers[0]
			var ref string
			for _, e := range ctr.Env {
				if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil {
					ref = e.ValueFrom.ResourceFieldRef.ContainerName + "/" + e.ValueFrom.ResourceFieldRef.Resource
				}
			}
			got := ctr.Resources.Limits.Memory().String()
			switch {
			case c.limit == "" && ref != "":
				t.Errorf("values %q: GOMEMLIMIT from %s without a memory limit", c.values, ref)
			case c.limit != "" && (ref != ctr.Name+"/limits.memory" || got != c.limit):
				t.Errorf("values %q: GOMEMLIMIT from %q, limit %s; want %s/limits.memory and %s", c.values, ref, got, ctr.Name, c.limit)
			}
		}
	})

	// helm --set types only integers and booleans: 0.2 arrives as the
	// string "0.2" and an all-digit image tag as a number. The schema takes
	// what --set produces for every numeric and tag value, and still
	// refuses what is out of range.
	t.Run("SetFlags", func(t *testing.T) {
		base := []string{"--set", "clusterName=c1", "--set", "controller.database.existingSecret=db", "--set", "prometheusRule.enabled=true"}
		base = append(base, promOpAPI...)
		for _, c := range []struct {
			set  []string
			want string // in the rendered output; "" an error naming the value
		}{
			{[]string{"--set", "prometheusRule.agentsSilentRatio=0.2"}, "> 0.2\n"},
			{[]string{"--set", "prometheusRule.agentsSilentRatio=.35"}, "> 0.35\n"},
			{[]string{"--set", "prometheusRule.agentsSilentRatio=1"}, "> 1\n"},
			{[]string{"--set-json", "prometheusRule.agentsSilentRatio=0.25"}, "> 0.25\n"},
			{[]string{"--set", "prometheusRule.heldForMinutes=45", "--set", "prometheusRule.breakerOpenForMinutes=90"}, "for: 90m"},
			{[]string{"--set", "controller.replicas=2", "--set", "agent.metricsPort=9411", "--set", "agent.token.expirationSeconds=7200"}, "--listen=:9411"},
			{[]string{"--set", "agent.image.tag=25"}, "fleetrepair-agent:25-dcgm4"},
			{[]string{"--set", "controller.image.tag=7"}, "image: ghcr.io/fleetrepair/fleetrepair:7\n"},
			{[]string{"--set", "prometheusRule.agentsSilentRatio=0"}, ""},
			{[]string{"--set", "prometheusRule.agentsSilentRatio=1.5"}, ""},
			{[]string{"--set", "prometheusRule.agentsSilentRatio=many"}, ""},
			{[]string{"--set", "agent.privileged=yes"}, ""},
		} {
			args := append([]string{"template", release, chartDir(t), "--namespace", namespace, "--kube-version", kubeVersion}, base...)
			out, err := helm(t, append(args, c.set...)...)
			switch {
			case c.want == "" && (err == nil || !strings.Contains(err.Error(), "schema")):
				t.Errorf("%v: err = %v, want a schema error", c.set, err)
			case c.want != "" && err != nil:
				t.Errorf("%v: %v", c.set, err)
			case c.want != "" && !strings.Contains(string(out), c.want):
				t.Errorf("%v: the rendered chart lacks %q", c.set, c.want)
			}
		}
	})

	// values.schema.json: a typo or a wrong type fails the install instead
	// of being ignored (controler.dryRun would leave deletions on).
	t.Run("SchemaRejectsMistakes", func(t *testing.T) {
		for _, c := range []struct{ values, want string }{
			{baseValues + "controler: {dryRun: true}\n", "additional properties 'controler' not allowed"},
			{baseValues + "  dryrun: true\n", "additional properties 'dryrun' not allowed"},
			{baseValues + "  dryRun: \"false\"\n", "dryRun"},
			{baseValues + "agent: {dcgm: {mode: embedded}}\n", "mode"},
			{baseValues + "  replicas: 0\n", "replicas"},
			{baseValues + "agent: {image: {digest: latest}}\n", "digest"},
			{baseValues + "  oidc: {roles: {oncall: root}}\n", "roles"},
			{baseValues + "  config: {breakr: {labels: [rack]}}\n", "additional properties 'breakr' not allowed"},
		} {
			_, err := render(t, c.values)
			if err == nil || !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("values %q: err = %v, want a schema error naming %q", c.values, err, c.want)
			}
		}
	})
}

// standInCRDs serve the Prometheus Operator kinds the chart renders
// (ServiceMonitor, PodMonitor, PrometheusRule) and cert-manager's
// Certificate, so they are created for real. They are stand-ins: their
// schema preserves unknown fields, so the API server checks the objects'
// group, version, kind and metadata, not their spec (promtool checks the
// rules, TestAlertRules).
func standInCRDs() []*apiextensionsv1.CustomResourceDefinition {
	crd := func(group, kind, plural string) *apiextensionsv1.CustomResourceDefinition {
		preserve := true
		return &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: group, Scope: apiextensionsv1.NamespaceScoped,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: kind, Plural: plural, ListKind: kind + "List", Singular: strings.ToLower(kind)},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: &preserve}}}},
			},
		}
	}
	return []*apiextensionsv1.CustomResourceDefinition{
		crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
		crd("monitoring.coreos.com", "PodMonitor", "podmonitors"),
		crd("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
		crd("cert-manager.io", "Certificate", "certificates"),
	}
}

func hasFlag(help, flag string) bool {
	return strings.Contains(help, " "+flag+" ") || strings.Contains(help, " "+flag+"\n")
}

// checkNetworkPolicy checks the controller's NetworkPolicy: it selects the
// controller pods and admits its port.
func checkNetworkPolicy(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	np := typed[networkingv1.NetworkPolicy](t, find(objs, "NetworkPolicy", "fleetrepair-controller"))
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"] != "controller" {
		t.Errorf("NetworkPolicy selects %v, want the controller pods", np.Spec.PodSelector.MatchLabels)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.String() != "http" || len(np.Spec.Ingress[0].From) < 2 {
		t.Errorf("NetworkPolicy ingress = %+v, want the http port from this release and allowFrom", np.Spec.Ingress)
	}
}

// agentNeeds is, per monitor of the agent, what its pod must carry for the
// monitor to see the node (agent/source/*, cmd/fleetrepair-agent/run.go);
// each returns what is missing, "" when nothing. A monitor the values turn
// off must be off in the args instead (off).
var agentNeeds = []struct {
	monitor string
	off     func(args []string) bool
	need    func(p agentPod) string
}{
	{"kmsg (kernel log)", nil, func(p agentPod) string {
		// Privileged: runc's device cgroup lets an unprivileged container
		// open no host device it was not given (kmsg is 1:11), as
		// node-problem-detector's DaemonSet knows. Unprivileged is the
		// operator's choice (agent.privileged=false), with CAP_SYSLOG.
		if v := p.hostPath("/dev/kmsg"); v == nil || v.Type == nil || *v.Type != corev1.HostPathCharDev || !p.privileged && !slices.Contains(p.caps, "SYSLOG") {
			return "hostPath /dev/kmsg (CharDevice) mounted at /dev/kmsg and privileged (or CAP_SYSLOG)"
		}
		return p.mountedAt("/dev/kmsg", "/dev/kmsg")
	}},
	{"sysfs (GPUs on the bus, AER, DMI)", func(a []string) bool { return slices.Contains(a, "--no-sysfs") }, func(p agentPod) string {
		return p.mountedAt("/sys", p.hostRoot+"/sys")
	}},
	{"procfs (stuck GPU processes)", func(a []string) bool { return slices.Contains(a, "--no-stuck-process") }, func(p agentPod) string {
		if !p.privileged && !slices.Contains(p.caps, "SYS_PTRACE") {
			return "CAP_SYS_PTRACE (reads /proc/PID/fd of other containers)"
		}
		return p.mountedAt("/proc", p.hostRoot+"/proc")
	}},
	{"cri (container runtime)", func(a []string) bool { return slices.Contains(a, "--cri-socket=") }, func(p agentPod) string {
		sock := p.arg("--cri-socket")
		if sock == "" {
			return "--cri-socket"
		}
		return p.mountedAt(filepath.Dir(sock), p.hostRoot+filepath.Dir(sock))
	}},
	{"kubelet (health port on 127.0.0.1)", func(a []string) bool { return slices.Contains(a, "--kubelet-healthz=") }, func(p agentPod) string {
		if !p.spec.HostNetwork || p.spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			return "hostNetwork with dnsPolicy ClusterFirstWithHostNet"
		}
		return ""
	}},
	{"nvml (driver library)", func(a []string) bool { return slices.Contains(a, "--no-nvml") }, func(p agentPod) string {
		if p.spec.RuntimeClassName == nil {
			return "" // without the toolkit NVML reports unknown, saying why
		}
		if *p.spec.RuntimeClassName != "nvidia" || !strings.Contains(p.env["NVIDIA_DRIVER_CAPABILITIES"], "utility") || p.env["NVIDIA_VISIBLE_DEVICES"] == "" {
			return "runtimeClassName nvidia with NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES including utility"
		}
		// The nvidia runtime exists on GPU nodes only: a pod of that
		// class elsewhere never starts.
		gpuOnly := p.spec.NodeSelector["nvidia.com/gpu.present"] == "true"
		if a := p.spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			gpuOnly = gpuOnly || len(terms) > 0 && !slices.ContainsFunc(terms, func(term corev1.NodeSelectorTerm) bool {
				return !slices.ContainsFunc(term.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool {
					return strings.Contains(e.Key, "gpu")
				})
			})
		}
		if !gpuOnly {
			return "a node selector or required affinity limiting the nvidia runtime class to GPU nodes"
		}
		return ""
	}},
	{"dcgm (nv-hostengine)", func(a []string) bool { return slices.Contains(a, "--no-dcgm") }, func(p agentPod) string {
		addr := p.arg("--dcgm-address")
		switch {
		case addr == "":
			return "--dcgm-address"
		case strings.HasPrefix(addr, "127.0.0.1:") && !p.spec.HostNetwork:
			return "hostNetwork for a hostengine on the node"
		}
		return ""
	}},
	{"uplink (projected token)", nil, func(p agentPod) string {
		for _, v := range p.spec.Volumes {
			if v.Projected != nil {
				for _, src := range v.Projected.Sources {
					if src.ServiceAccountToken != nil && src.ServiceAccountToken.Audience == "fleetrepair" && slices.Contains(p.args, "--token-file=/var/run/secrets/fleetrepair/token") {
						return p.mountedAt("", "/var/run/secrets/fleetrepair")
					}
				}
			}
		}
		return "projected fleetrepair-audience token in --token-file"
	}},
}

// agentPod is the agent's pod spec with its container's facts at hand.
type agentPod struct {
	spec       corev1.PodSpec
	privileged bool
	args       []string
	caps       []string
	env        map[string]string
	hostRoot   string
}

func (p agentPod) arg(name string) string {
	for _, a := range p.args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func (p agentPod) hostPath(path string) *corev1.HostPathVolumeSource {
	for _, v := range p.spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == path {
			return v.HostPath
		}
	}
	return nil
}

// mountedAt says what is missing for host path (or, "" host, any volume)
// to be mounted read-only at mountPath.
func (p agentPod) mountedAt(host, mountPath string) string {
	for _, m := range p.spec.Containers[0].VolumeMounts {
		if m.MountPath != mountPath {
			continue
		}
		for _, v := range p.spec.Volumes {
			if v.Name == m.Name && (host == "" || v.HostPath != nil && v.HostPath.Path == host) && m.ReadOnly {
				return ""
			}
		}
	}
	if host == "" {
		return "a read-only volume at " + mountPath
	}
	return "hostPath " + host + " mounted read-only at " + mountPath
}

// checkAgent checks the agent DaemonSet: what every enabled monitor needs
// (agentNeeds), that it runs on every node (every taint tolerated, the
// quarantine taint included) at system-node-critical, with no API token,
// probes, no CPU limit and requests of the measured footprint.
func checkAgent(t *testing.T, objs []*unstructured.Unstructured, wantPrivileged bool) {
	t.Helper()
	ds := typed[appsv1.DaemonSet](t, find(objs, "DaemonSet", "fleetrepair-agent"))
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	p := agentPod{spec: spec, args: c.Args, env: map[string]string{}}
	for _, e := range c.Env {
		p.env[e.Name] = e.Value
	}
	if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil {
		for _, cp := range sc.Capabilities.Add {
			p.caps = append(p.caps, string(cp))
		}
	}
	p.privileged = c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
	p.hostRoot = p.arg("--host-root")
	if p.hostRoot == "" || p.hostRoot == "/" {
		t.Fatalf("agent args %v: want --host-root at the host mounts", c.Args)
	}
	for _, n := range agentNeeds {
		if n.off != nil && n.off(c.Args) {
			t.Logf("agent monitor %s: off in these values", n.monitor)
			continue
		}
		if missing := n.need(p); missing != "" {
			t.Errorf("agent monitor %s: the pod lacks %s", n.monitor, missing)
		}
	}

	if spec.ServiceAccountName != agentSA || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("agent: serviceAccount %q automount %v, want %s without an API token", spec.ServiceAccountName, spec.AutomountServiceAccountToken, agentSA)
	}
	quarantine := corev1.Taint{Key: kube.QuarantineTaintKey, Effect: corev1.TaintEffectNoSchedule}
	for _, taint := range []corev1.Taint{quarantine, {Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule},
		{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute}} {
		if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &taint, false) }) {
			t.Errorf("agent tolerations %v do not tolerate %v: it must run on quarantined and GPU-tainted nodes", spec.Tolerations, taint)
		}
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("agent priorityClassName = %q, want system-node-critical", spec.PriorityClassName)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("agent security context = %+v, want a read-only root", sc)
	case p.privileged != wantPrivileged:
		t.Errorf("agent privileged = %v, want %v (agent.privileged)", p.privileged, wantPrivileged)
	case p.privileged && (sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation || sc.Capabilities != nil):
		t.Errorf("agent security context = %+v: privileged takes no capability list and cannot forbid escalation", sc)
	case !p.privileged && (sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation):
		t.Errorf("agent security context = %+v, want every capability dropped but the monitors', no escalation", sc)
	}
	if p.env["NODE_NAME"] != "" || !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("agent env %v: want NODE_NAME from spec.nodeName", c.Env)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/livez" {
		t.Errorf("agent probes: readiness %+v liveness %+v, want /readyz and /livez", c.ReadinessProbe, c.LivenessProbe)
	}
	if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Errorf("agent has a CPU limit: throttling would add jitter to the node's jobs")
	}
	// The measured footprint (test/agentbench, make bench-agent): 0.034
	// cores and 25.5 MiB RSS under a 2,000 lines/s kernel-log flood.
	cpu, mem := c.Resources.Requests[corev1.ResourceCPU], c.Resources.Requests[corev1.ResourceMemory]
	if cpu.MilliValue() < 34 || cpu.MilliValue() > 100 || mem.Value() < 26<<20 || mem.Value() > 64<<20 {
		t.Errorf("agent requests cpu %s memory %s, want them at the measured footprint (34m-100m, 26-64Mi)", cpu.String(), mem.String())
	}
	if lim := c.Resources.Limits[corev1.ResourceMemory]; lim.Cmp(mem) <= 0 {
		t.Errorf("agent memory limit %s, want above the request %s", lim.String(), mem.String())
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
		"--leader-elect-identity=$(POD_NAME)", "--leader-elect-lease-duration=15s", "--leader-elect-renew-deadline=10s",
		"--leader-elect-retry-period=2s", "--agent-auth=tokenreview", "--agent-audience=fleetrepair",
		"--agent-service-account=system:serviceaccount:fleetrepair:fleetrepair-agent"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("controller args %v: missing %s", c.Args, arg)
		}
	}
	checkControllerConfig(t, objs, pod, c)
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("controller readiness probe = %+v", c.ReadinessProbe)
	}
	// The operators file: from the Secret, mounted where the flag says.
	for _, a := range c.Args {
		if path, ok := strings.CutPrefix(a, "--operators-file="); ok {
			if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == filepath.Dir(path) && m.Name == "operators" }) ||
				!slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
					return v.Name == "operators" && v.Secret != nil && v.Secret.SecretName == "fleetrepair-operators"
				}) {
				t.Errorf("controller: --operators-file %s without the operators Secret mounted there", path)
			}
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

// checkControllerConfig checks the controller configuration the chart
// renders: --config names a file of the ConfigMap's volume, and the file
// passes the controller's own strict parser (controller/config) with the
// values' budgets, dry run and resync in it and controller.config over
// them. No configuration flag is passed besides --config, so the file is
// the one place they are set.
func checkControllerConfig(t *testing.T, objs []*unstructured.Unstructured, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	var path string
	for _, a := range c.Args {
		if p, ok := strings.CutPrefix(a, "--config="); ok {
			path = p
		}
		for _, f := range []string{"--dry-run", "--resync", "--deletions-per-hour", "--nodepool-deletions-per-hour", "--max-in-flight-per-nodepool", "--policy", "--toleration", "--workers"} {
			if a == f || strings.HasPrefix(a, f+"=") {
				t.Errorf("controller args %v: %s would override the configuration file", c.Args, f)
			}
		}
	}
	if path == "" {
		t.Fatalf("controller args %v: no --config", c.Args)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "config" && m.MountPath == filepath.Dir(path) }) ||
		!slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
			return v.Name == "config" && v.ConfigMap != nil && v.ConfigMap.Name == "fleetrepair-controller-config"
		}) {
		t.Errorf("controller: --config %s without the config ConfigMap mounted there", path)
	}
	cm := typed[corev1.ConfigMap](t, find(objs, "ConfigMap", "fleetrepair-controller-config"))
	doc, ok := cm.Data[filepath.Base(path)]
	if !ok {
		t.Fatalf("config ConfigMap has no %s: %v", filepath.Base(path), cm.Data)
	}
	cfg, err := config.Parse([]byte(doc), nil)
	if err != nil {
		t.Fatalf("rendered configuration refused by the controller's parser: %v\n%s", err, doc)
	}
	if cfg.Budgets.DeletionsPerHour <= 0 || cfg.Budgets.MaxInFlightPerNodePool <= 0 || !strings.Contains(doc, "dryRun") || !strings.Contains(doc, "resync") {
		t.Errorf("rendered configuration lacks the values' budgets, dry run or resync:\n%s", doc)
	}
	if strings.Contains(doc, "topology.kubernetes.io/rack") && (!slices.Contains(cfg.Breaker.Labels, "topology.kubernetes.io/rack") ||
		cfg.Budgets.DeletionsPerHour != 4 || cfg.Budgets.MinHealthy != 2 || cfg.Repair.ApprovalTTL.String() != "12h0m0s") {
		t.Errorf("controller.config and budgets not both in the rendered configuration: %+v", cfg)
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

// install creates every object with server-side apply (the API server
// types every field against its schema: an unknown or misplaced field is an
// error, not dropped), reads each back, dry-run creates the pod of each
// workload (pod admission: Pod Security, Priority, RuntimeClass) and then
// deletes what it created, so the next value set starts clean. Only the
// agent DaemonSet may draw Pod Security warnings.
func install(t *testing.T, env *envtest.Env, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	w := &warnings{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandlerWithContext = w
	c, err := client.New(cfg, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var created []*unstructured.Unstructured
	t.Cleanup(func() {
		for _, o := range created {
			if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	})
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()),
			client.ForceOwnership, client.FieldOwner("fleetrepair-chart-test"))
		if err != nil {
			t.Errorf("server-side apply of %s %s: %v", gvk.Kind, o.GetName(), err)
			continue
		}
		created = append(created, o)
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(gvk)
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			t.Errorf("get %s %s after creating it: %v", gvk.Kind, o.GetName(), err)
		}
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
	t.Logf("installed %d of %d objects", len(created), len(objs))
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
			if !hasFlag(help[what], name) {
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

// TestChartRBACText: the controller row of deploy/chart/README.md's
// permissions table names exactly the rules the chart renders ("`group/
// resource` verb/verb" items; core resources without a group), for the
// ClusterRole and the namespace Role, secrets included when
// clusterSecrets is on.
func TestChartRBACText(t *testing.T) {
	envtest.Tool(t, "helm")
	root, err := envtest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "deploy", "chart", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| controller |") {
			row = line
		}
	}
	cluster, rest, ok := strings.Cut(row, "Role in the release namespace:")
	if !ok {
		t.Fatalf("README controller row %q lacks its Role part", row)
	}
	role, _, _ := strings.Cut(rest, "Nothing else")
	item := regexp.MustCompile("`([a-z0-9./-]+)` ([a-z]+(?:/[a-z]+)*)")
	fromText := func(text string) []string {
		var out []string
		for _, m := range item.FindAllStringSubmatch(text, -1) {
			if strings.Contains(m[1], "do-not-disrupt") {
				continue
			}
			for _, v := range strings.Split(m[2], "/") {
				out = append(out, m[1]+" "+v)
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	objs, err := render(t, baseValues+"  clusterSecrets: {enabled: true}\n")
	if err != nil {
		t.Fatal(err)
	}
	fromRules := func(kind string) []string {
		var out []string
		for _, o := range objs {
			if o.GetKind() != kind {
				continue
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				m := r.(map[string]any)
				for _, g := range m["apiGroups"].([]any) {
					for _, res := range m["resources"].([]any) {
						for _, v := range m["verbs"].([]any) {
							name := res.(string)
							if g.(string) != "" {
								name = g.(string) + "/" + name
							}
							out = append(out, name+" "+v.(string))
						}
					}
				}
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	for _, c := range []struct{ kind, text string }{{"ClusterRole", cluster}, {"Role", role}} {
		if got, want := fromText(c.text), fromRules(c.kind); !slices.Equal(got, want) {
			t.Errorf("README says the %s grants\n  %v\nthe chart renders\n  %v", c.kind, got, want)
		}
	}
}
