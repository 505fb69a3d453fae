package remote

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestParse(t *testing.T) {
	sec := func(name string, data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fr", ResourceVersion: "7"}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	c, err := Parse(sec("west", map[string]string{KeyKubeconfig: kubeconfig}))
	if err != nil || c.Name != "west" || c.Config.Host != "https://10.0.0.1:6443" || c.Config.BearerToken != "abc" || c.Secret != "fr/west" || c.Version != "7" {
		t.Fatalf("Parse = %+v, %v", c, err)
	}
	if c, err := Parse(sec("cluster-1", map[string]string{KeyName: "prod-east", KeyKubeconfig: kubeconfig})); err != nil || c.Name != "prod-east" {
		t.Fatalf("name key: %+v, %v", c, err)
	}
	for _, tc := range []struct {
		name string
		data map[string]string
		want string
	}{
		{"no kubeconfig", map[string]string{}, `no "kubeconfig" key`},
		{"bad kubeconfig", map[string]string{KeyKubeconfig: "not: [yaml"}, "load kubeconfig"},
		{"bad name", map[string]string{KeyName: "East_1", KeyKubeconfig: kubeconfig}, `cluster name "East_1"`},
		{"no context", map[string]string{KeyKubeconfig: "apiVersion: v1\nkind: Config\n"}, "load kubeconfig"},
	} {
		_, err := Parse(sec("s", tc.data))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "fr/s") {
			t.Errorf("%s: err = %v, want it to name the Secret and %q", tc.name, err, tc.want)
		}
	}
}
