package kube

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// ReportingController is the reportingController of the events.k8s.io/v1
// Events fleetrepair writes (kubectl get events -o wide shows it).
const ReportingController = "fleetrepair.dev/controller"

// maxNote is the events.k8s.io/v1 limit on an Event's note, in bytes.
const maxNote = 1024

// Event is one step of a node's repair, told on its Node and its NodeClaim
// (Events.Record).
type Event struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type string
	// Reason is a CamelCase reason (controller/repair's Reason* names).
	Reason string
	// Action is what fleetrepair did or refused to do: "Quarantine",
	// "DeleteNodeClaim", "Hold".
	Action string
	// Note is the human-readable story, cut to 1 KiB.
	Note string
}

// Subject is the Node (and its NodeClaim, "" when none) an Event is about.
type Subject struct {
	Node         string
	NodeClaim    string
	NodeClaimUID types.UID
}

// Events writes events.k8s.io/v1 Events through client-go's events
// broadcaster (k8s.io/client-go/tools/events), one per cluster, created on
// first use: writes are asynchronous (a reconcile never waits on the
// Events API or its rate limit), retried on transport errors, and
// isomorphic Events (same regarding object, reason, action, type and
// reporting controller) are merged into one Event whose series count
// grows, patched at most every 30 minutes. Callers still record each fact
// once (controller/repair records at ledger transitions and when a hold
// starts), so the series counts real repeats, not reconciles.
//
// Events owns the broadcasters' goroutines until Close. The zero value is
// not usable; a nil *Events records nothing.
type Events struct {
	ctx    context.Context // the broadcasters' lifetime, ended by Close
	cancel context.CancelFunc

	mu   sync.Mutex
	recs map[*Cluster]recorder
}

type recorder struct {
	b   events.EventBroadcaster
	rec events.EventRecorder
}

// NewEvents returns an Events recorder; call Close when done.
func NewEvents() *Events {
	ctx, cancel := context.WithCancel(context.Background())
	return &Events{ctx: ctx, cancel: cancel, recs: map[*Cluster]recorder{}}
}

// Close stops every broadcaster; Events queued and not yet written are
// dropped (they are a story, not a record: the ledger is the record).
func (e *Events) Close() {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cancel()
	for k, r := range e.recs {
		r.b.Shutdown()
		delete(e.recs, k)
	}
}

// Forget stops the broadcaster of a cluster the controller no longer
// serves.
func (e *Events) Forget(k *Cluster) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if r, ok := e.recs[k]; ok {
		r.b.Shutdown()
		delete(e.recs, k)
	}
}

func (e *Events) recorder(k *Cluster) (events.EventRecorder, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() != nil {
		return nil, false
	}
	r, ok := e.recs[k]
	if !ok {
		b := events.NewBroadcaster(sink{c: k.c})
		if err := b.StartRecordingToSinkWithContext(e.ctx); err != nil {
			return nil, false // only when ctx ended
		}
		r = recorder{b: b, rec: b.NewRecorder(Scheme, ReportingController)}
		e.recs[k] = r
	}
	return r.rec, true
}

// Record tells ev on the subject's Node (related: its NodeClaim) and, when
// it has one, on its NodeClaim (related: the Node), so `kubectl describe
// node` and `kubectl describe nodeclaim` both show it. The Node reference
// carries the node's name as its UID, the kubelet's convention for node
// Events that `kubectl describe node` also searches. Nothing is returned:
// the broadcaster writes asynchronously and logs what it cannot write.
func (e *Events) Record(k *Cluster, s Subject, ev Event) {
	if e == nil || k == nil || s.Node == "" {
		return
	}
	rec, ok := e.recorder(k)
	if !ok {
		return
	}
	if len(ev.Note) > maxNote {
		ev.Note = ev.Note[:maxNote-3] + "..."
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Node, UID: types.UID(s.Node)}}
	var claim *karpv1.NodeClaim
	if s.NodeClaim != "" {
		claim = &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: s.NodeClaim, UID: s.NodeClaimUID}}
		rec.Eventf(node, claim, ev.Type, ev.Reason, ev.Action, "%s", ev.Note)
		rec.Eventf(claim, node, ev.Type, ev.Reason, ev.Action, "%s", ev.Note)
		return
	}
	rec.Eventf(node, nil, ev.Type, ev.Reason, ev.Action, "%s", ev.Note)
}

// RecordNodeClaim tells ev on a NodeClaim alone (one without a Node: a
// launch that never registered).
func (e *Events) RecordNodeClaim(k *Cluster, name string, uid types.UID, ev Event) {
	if e == nil || k == nil || name == "" {
		return
	}
	rec, ok := e.recorder(k)
	if !ok {
		return
	}
	if len(ev.Note) > maxNote {
		ev.Note = ev.Note[:maxNote-3] + "..."
	}
	rec.Eventf(&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}, nil, ev.Type, ev.Reason, ev.Action, "%s", ev.Note)
}

// sink is the broadcaster's events.EventSink over a controller-runtime
// client, so the same recorder writes to a real API server and to the
// client fakes. Errors are the client's (API status errors as client-go's
// REST client returns them, which the broadcaster's retry logic reads).
type sink struct{ c client.Client }

func (s sink) Create(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	out := ev.DeepCopy()
	if err := s.c.Create(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (s sink) Update(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	out := ev.DeepCopy()
	if err := s.c.Update(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (s sink) Patch(ctx context.Context, old *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	out := old.DeepCopy()
	if err := s.c.Patch(ctx, out, client.RawPatch(types.StrategicMergePatchType, data)); err != nil {
		return nil, err
	}
	return out, nil
}
