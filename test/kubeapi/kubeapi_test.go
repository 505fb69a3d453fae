// Package kubeapi tests what fleetrepair deploys against a real
// kube-apiserver with the Karpenter CRDs (test/envtest): the Helm chart
// under deploy/chart, rendered by the real helm (`make kube-tools` builds
// it) and applied with server-side dry-run, and the controller's RBAC from
// that chart, under which the real repair path runs with RBAC authorization
// on while everything the role does not grant is refused.
package kubeapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	// release and namespace of the chart in every test; the release name
	// contains the chart's name, so objects are named fleetrepair-<part>.
	release   = "fleetrepair"
	namespace = "fleetrepair"
	// kubeVersion is the version of the API server `make kube-tools` builds.
	kubeVersion = "v1.35.4"

	controllerSA = "fleetrepair-controller"
	agentSA      = "fleetrepair-agent"
)

// baseValues are the chart's required values.
const baseValues = `
clusterName: c1
controller:
  database:
    existingSecret: fleetrepair-db
`

// helm runs the helm binary from `make kube-tools` with its cache, config
// and data folders in a temporary folder, so no user or machine settings
// take part. It returns stdout, or an error carrying stderr.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin := envtest.Tool(t, "helm")
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, errors.New(strings.TrimSpace(stderr.String()) + " (" + err.Error() + ")")
	}
	return out, nil
}

// chartDir is deploy/chart under the module root.
func chartDir(t *testing.T) string {
	t.Helper()
	root, err := envtest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "chart")
}

// valuesFile writes values to a temporary file for helm's --values.
func valuesFile(t *testing.T, values string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// render runs `helm template` on the chart with values (and extra helm
// flags, such as --api-versions) and returns the objects, in helm's order,
// or helm's error.
func render(t *testing.T, values string, extra ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	out, err := helm(t, append([]string{"template", release, chartDir(t), "--namespace", namespace,
		"--kube-version", kubeVersion, "--values", valuesFile(t, values)}, extra...)...)
	if err != nil {
		return nil, err
	}
	return decode(out)
}

// decode splits a YAML stream into objects, skipping empty documents.
func decode(stream []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find returns the rendered object of that kind and name, or nil.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// typed converts a rendered object into its Go type.
func typed[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	if u == nil {
		t.Fatalf("object of %T not rendered", new(T))
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("convert %s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

// createNamespace creates the release namespace (helm's --create-namespace
// does the same outside the chart).
func createNamespace(t *testing.T, env *envtest.Env, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: labels}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}
