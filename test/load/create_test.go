package load

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestCreateBareNodeRetries: a transient answer (etcd's timeout, a 429) is
// retried until the create lands, AlreadyExists after a retry is success,
// and a permanent error is returned at once, naming the node and the tries.
func TestCreateBareNodeRetries(t *testing.T) {
	old := createBackoff
	createBackoff = wait.Backoff{Steps: 4, Duration: time.Millisecond, Factor: 1}
	t.Cleanup(func() { createBackoff = old })
	nodes := schema.GroupResource{Resource: "nodes"}
	for _, tc := range []struct {
		name    string
		answers []error // the first creates' errors, then the real create
		wantErr error   // nil: created
		tries   int
	}{
		{"etcd timeout then created", []error{apierrors.NewInternalError(errors.New("etcdserver: request timed out")),
			apierrors.NewTooManyRequests("slow down", 1)}, nil, 3},
		{"a timed-out try that landed", []error{apierrors.NewServerTimeout(nodes, "create", 1),
			apierrors.NewAlreadyExists(nodes, "gpu-a-00001")}, nil, 2},
		{"a permanent error is not retried", []error{apierrors.NewBadRequest("bad node")}, errors.New("bad node"), 1},
		{"a first AlreadyExists is an error", []error{apierrors.NewAlreadyExists(nodes, "gpu-a-00001")}, errors.New("already exists"), 1},
		{"gives up after the backoff", []error{apierrors.NewServerTimeout(nodes, "create", 1), apierrors.NewServerTimeout(nodes, "create", 1),
			apierrors.NewServerTimeout(nodes, "create", 1), apierrors.NewServerTimeout(nodes, "create", 1)}, errors.New("4 tries"), 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			tries := 0
			cs.PrependReactor("create", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				tries++
				if tries <= len(tc.answers) {
					return true, nil, tc.answers[tries-1]
				}
				return false, nil, nil // the tracker creates it
			})
			n := &node{name: "gpu-a-00001", zone: "zone-a", cluster: "load-01", boot: "b"}
			err := createBareNode(context.Background(), cs, n)
			if tries != tc.tries {
				t.Errorf("%d create requests, want %d", tries, tc.tries)
			}
			if tc.wantErr != nil {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr.Error()) || !strings.Contains(err.Error(), "load-01/gpu-a-00001") {
					t.Fatalf("err = %v, want one naming load-01/gpu-a-00001 and %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", n.name); err != nil && tc.tries > len(tc.answers) {
				t.Fatalf("node not created: %v", err)
			}
		})
	}
}
