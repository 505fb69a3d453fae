package runner

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/remote"
)

// ClusterSecrets makes the controller serve, besides Options.Clusters, the
// clusters named by kubeconfig Secrets (controller/remote) in one namespace
// of its home cluster, picked up and dropped without a restart.
type ClusterSecrets struct {
	// Client reads the Secrets (the controller's home cluster).
	Client kubernetes.Interface
	// Namespace holding the Secrets (the controller's own).
	Namespace string
	// Connect builds a cluster's cached Kubernetes access and the clientset
	// for TokenReview and leader election from its credential, each with
	// its own client-side limits (cmd/fleetrepair's clusterFrom).
	Connect func(name string, cfg *rest.Config) (*kube.Cluster, kubernetes.Interface, error)
}

// clusterSwitch is what a served cluster's credential reaches besides the
// reconciler: TokenReview of its agents' tokens.
type clusterSwitch interface {
	SetCluster(cluster string, cs kubernetes.Interface)
	RemoveCluster(cluster string)
}

// remoteClusters serves the clusters of kubeconfig Secrets: the reconciler,
// the agents' TokenReview, the deletion budgets and the cluster's leader
// election all learn of a cluster from Upsert and forget it in Remove.
type remoteClusters struct {
	c   *Controller
	ctx context.Context // Run's: elections of added clusters run under it

	mu        sync.Mutex
	elections map[string]context.CancelFunc
}

func (rc *remoteClusters) Upsert(ctx context.Context, cl remote.Cluster) error {
	o := rc.c.opts
	k, cs, err := o.ClusterSecrets.Connect(cl.Name, cl.Config)
	if err != nil {
		return fmt.Errorf("connect to cluster %s: %w", cl.Name, err)
	}
	if !rc.c.rec.Serves(cl.Name) {
		if err := rc.c.setBudgets(ctx, cl.Name, rc.c.cfg.Budgets); err != nil {
			return err
		}
	}
	if sw, ok := o.Authenticator.(clusterSwitch); ok {
		sw.SetCluster(cl.Name, cs)
	}
	if err := rc.c.rec.AddCluster(cl.Name, k); err != nil {
		return err
	}
	if le := o.LeaderElection; le != nil {
		rc.mu.Lock()
		if stop, ok := rc.elections[cl.Name]; ok {
			stop() // a rotated credential: campaign with the new one
		}
		ectx, stop := context.WithCancel(rc.ctx)
		rc.elections[cl.Name] = stop
		rc.mu.Unlock()
		go func() { _ = runElection(ectx, *le, cl.Name, cs, rc.c.rec.SetLeading) }()
	}
	return nil
}

func (rc *remoteClusters) Remove(name string) {
	rc.mu.Lock()
	if stop, ok := rc.elections[name]; ok {
		stop() // releases the Lease (ReleaseOnCancel)
		delete(rc.elections, name)
	}
	rc.mu.Unlock()
	rc.c.rec.RemoveCluster(name)
	if rc.c.opts.LeaderElection != nil {
		rc.c.rec.SetLeading(name, false)
	}
	if sw, ok := rc.c.opts.Authenticator.(clusterSwitch); ok {
		sw.RemoveCluster(name)
	}
}
