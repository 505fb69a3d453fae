package load

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetrepair/fleetrepair/test/envtest"
)

// BenchmarkCreateBareNode measures the fleet scenario's Node creation
// (createBareNode, one request per Node with its status) on one real API
// server, 4 creators as in setupOtherClusters, with the clientset in JSON
// (client-go's default) and in protobuf (clients). The harness's own CPU is
// in ns/op with the API server's and etcd's: on 2 cores they share it.
//
//	go test ./test/load -run '^$' -bench BenchmarkCreateBareNode -benchtime 2000x
func BenchmarkCreateBareNode(b *testing.B) {
	env := envtest.Start(b, envtest.Options{GoGC: 25})
	for _, tc := range []struct{ name, contentType string }{{"json", ""}, {"protobuf", runtime.ContentTypeProtobuf}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := rest.CopyConfig(env.Config)
			cfg.QPS, cfg.Burst, cfg.ContentType = 2000, 4000, tc.contentType
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			work := make(chan *node)
			errs := make(chan error, 4)
			for range 4 {
				go func() {
					var first error
					for n := range work {
						if err := createBareNode(ctx, cs, n); err != nil && first == nil {
							first = err
						}
					}
					errs <- first
				}()
			}
			run, i := uuid.NewString()[:8], 0 // -count reruns: new names
			for b.Loop() {
				i++
				work <- &node{name: fmt.Sprintf("bench-%s-%s-%06d", tc.name, run, i), zone: "zone-b", cluster: "bench", boot: uuid.NewString()}
			}
			close(work)
			for range 4 {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
