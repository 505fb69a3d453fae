// Package remote picks up the clusters a controller serves from kubeconfig
// Secrets in its own namespace, and drops them when the Secret goes, without
// a restart (the pattern of Argo CD's cluster Secrets). A Secret is a
// cluster's credential when it carries the label
//
//	fleetrepair.io/secret-type: cluster
//
// and holds a kubeconfig under the key "kubeconfig" (its current context is
// used; exec credential plugins work when the plugin is in the controller's
// image) and optionally the cluster's name under "name" (default: the
// Secret's name). docs/install.md shows how to write one for EKS, GKE and a
// plain kubeconfig.
package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

// Label and LabelValue mark a Secret as a cluster credential.
const (
	Label      = "fleetrepair.io/secret-type"
	LabelValue = "cluster"
	// KeyKubeconfig holds the kubeconfig (required); KeyName the cluster's
	// name (optional, default the Secret's name).
	KeyKubeconfig = "kubeconfig"
	KeyName       = "name"
)

// Cluster is a cluster credential read from a Secret.
type Cluster struct {
	// Name is the cluster's name in reports, the ledger and the API (a DNS
	// label: lower-case letters, digits and '-', at most 63).
	Name string
	// Config reaches the cluster's API server.
	Config *rest.Config
	// Secret is the Secret's "namespace/name"; Version its resourceVersion.
	Secret, Version string
}

// Parse reads a cluster credential from s. Errors name the Secret and what
// is wrong (missing key, bad name, a kubeconfig that does not load).
func Parse(s *corev1.Secret) (Cluster, error) {
	ref := s.Namespace + "/" + s.Name
	name := s.Name
	if v, ok := s.Data[KeyName]; ok {
		name = string(v)
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return Cluster{}, fmt.Errorf("secret %s: cluster name %q: %s", ref, name, errs[0])
	}
	raw := s.Data[KeyKubeconfig]
	if len(raw) == 0 {
		return Cluster{}, fmt.Errorf("secret %s: no %q key", ref, KeyKubeconfig)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(raw)
	if err != nil {
		return Cluster{}, fmt.Errorf("secret %s: load kubeconfig: %w", ref, err)
	}
	return Cluster{Name: name, Config: cfg, Secret: ref, Version: s.ResourceVersion}, nil
}

// Handler serves the clusters a Watcher reads. Upsert is called for a new
// cluster and for a changed credential of a served one (replace it);
// Remove when its Secret is deleted or names another cluster now. An Upsert
// error is retried with backoff.
type Handler interface {
	Upsert(ctx context.Context, c Cluster) error
	Remove(name string)
}

// Watcher watches the cluster Secrets of one namespace and keeps Handler
// serving exactly the clusters they name. A Secret that does not parse, or
// names a cluster already given (by --cluster or by another Secret), is
// reported (log, fleetrepair_cluster_secrets{state="invalid"}, Problems)
// and changes nothing: a broken edit of a served cluster's Secret keeps the
// last good credential rather than dropping the cluster.
type Watcher struct {
	Client    kubernetes.Interface
	Namespace string
	Handler   Handler
	// Reserved reports names that are not a Secret's to give (the clusters
	// of --cluster); nil: none.
	Reserved func(name string) bool
	// Resync re-reads every Secret this often (default 10 minutes).
	Resync     time.Duration
	Log        *slog.Logger
	Registerer prometheus.Registerer

	mu       sync.Mutex
	bySecret map[string]Cluster // served, by Secret "namespace/name"
	owner    map[string]string  // cluster name -> Secret
	problems map[string]string  // Secret -> why it serves nothing new
	gauge    *prometheus.GaugeVec
}

// Run watches until ctx ends. It returns an error only when the watch
// cannot be set up; ctx's end is a clean return.
func (w *Watcher) Run(ctx context.Context) error {
	if w.Client == nil || w.Handler == nil || w.Namespace == "" {
		return errors.New("watch cluster secrets: Client, Handler and Namespace are required")
	}
	if w.Log == nil {
		w.Log = slog.Default()
	}
	if w.Resync == 0 {
		w.Resync = 10 * time.Minute
	}
	w.mu.Lock()
	w.bySecret, w.owner, w.problems = map[string]Cluster{}, map[string]string{}, map[string]string{}
	w.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetrepair_cluster_secrets",
		Help: "Cluster Secrets by state: served (a cluster is served from it) or invalid (see the controller log)."}, []string{"state"})
	w.mu.Unlock()
	if w.Registerer != nil {
		if err := w.Registerer.Register(w.gauge); err != nil {
			return fmt.Errorf("watch cluster secrets: register metrics: %w", err)
		}
	}
	f := informers.NewSharedInformerFactoryWithOptions(w.Client, w.Resync, informers.WithNamespace(w.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = Label + "=" + LabelValue }))
	inf := f.Core().V1().Secrets()
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "cluster_secrets"})
	enqueue := func(o any) {
		if key, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
			q.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("watch cluster secrets: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	go func() { <-ctx.Done(); q.ShutDown() }()
	for {
		key, shutdown := q.Get()
		if shutdown {
			return nil
		}
		err := w.sync(ctx, key, inf.Lister().Secrets(w.Namespace))
		if err != nil && ctx.Err() == nil {
			w.Log.Error("serve cluster from secret", "secret", key, "err", err, "retries", q.NumRequeues(key))
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}

// secretGetter is the part of a Secret lister sync reads.
type secretGetter interface {
	Get(name string) (*corev1.Secret, error)
}

// sync makes the Handler serve what the Secret key says now.
func (w *Watcher) sync(ctx context.Context, key string, secrets secretGetter) error {
	_, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not a key this queue makes; nothing to retry
	}
	s, err := secrets.Get(name)
	if apierrors.IsNotFound(err) {
		w.drop(key)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read secret %s: %w", key, err)
	}
	c, err := Parse(s)
	if err == nil {
		err = w.claim(key, c.Name)
	}
	if err != nil {
		w.problem(key, err)
		return nil // bad input is reported, not retried: the next edit is a new event
	}
	w.mu.Lock()
	prev, served := w.bySecret[key]
	w.mu.Unlock()
	if served && prev.Version == c.Version {
		return nil
	}
	if served && prev.Name != c.Name {
		w.drop(key) // the Secret names another cluster now (claimed above)
	}
	if err := w.Handler.Upsert(ctx, c); err != nil {
		return err
	}
	w.mu.Lock()
	w.bySecret[key] = c
	w.owner[c.Name] = key
	delete(w.problems, key)
	w.updateGaugeLocked()
	w.mu.Unlock()
	w.Log.Info("serving cluster from secret", "cluster", c.Name, "secret", key, "server", c.Config.Host)
	return nil
}

// claim checks that name is free for the Secret key.
func (w *Watcher) claim(key, name string) error {
	if w.Reserved != nil && w.Reserved(name) {
		return fmt.Errorf("secret %s: cluster %s is given by --cluster already", key, name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if o, ok := w.owner[name]; ok && o != key {
		return fmt.Errorf("secret %s: cluster %s is served from secret %s already", key, name, o)
	}
	return nil
}

// drop stops serving the cluster of the Secret key, if it served one.
func (w *Watcher) drop(key string) {
	w.mu.Lock()
	c, ok := w.bySecret[key]
	delete(w.bySecret, key)
	delete(w.problems, key)
	if ok {
		delete(w.owner, c.Name)
	}
	w.updateGaugeLocked()
	w.mu.Unlock()
	if ok {
		w.Handler.Remove(c.Name)
		w.Log.Info("stopped serving cluster: its secret is gone or names another cluster", "cluster", c.Name, "secret", key)
	}
}

func (w *Watcher) problem(key string, err error) {
	w.mu.Lock()
	w.problems[key] = err.Error()
	w.updateGaugeLocked()
	w.mu.Unlock()
	w.Log.Error("cluster secret refused; it serves nothing new until fixed", "secret", key, "err", err)
}

func (w *Watcher) updateGaugeLocked() {
	w.gauge.WithLabelValues("served").Set(float64(len(w.bySecret)))
	w.gauge.WithLabelValues("invalid").Set(float64(len(w.problems)))
}

// Problems returns, by Secret "namespace/name", why each refused Secret
// serves nothing new, sorted by Secret.
func (w *Watcher) Problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.problems))
	for _, p := range w.problems {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}
