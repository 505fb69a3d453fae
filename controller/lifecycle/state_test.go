package lifecycle

import (
	"strings"
	"testing"
	"time"

	"github.com/awslabs/operatorpkg/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// TestClassify walks a NodeClaim through Karpenter's lifecycle: each
// transitional state becomes stuck only after its grace; a condition the
// object lacks is never a verdict.
func TestClassify(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	created := now.Add(-2 * time.Hour)
	ok := Condition{Status: "True", Since: created.Add(time.Minute)}
	up := Facts{Name: "nc", NodeName: "n", Created: created, Launched: ok, Registered: ok, Initialized: ok}
	with := func(mod func(*Facts)) Facts { f := up; mod(&f); return f }
	tests := []struct {
		name         string
		f            Facts
		node         bool
		nodeDeleting time.Time
		want         State
		detail       string
	}{
		{"up", up, true, time.Time{}, StateActive, ""},
		{"drifted", with(func(f *Facts) { f.Drifted = true }), true, time.Time{}, StateDrifted, "drifted"},
		{"deleting 10m", with(func(f *Facts) { f.Deleting = now.Add(-10 * time.Minute) }), true, time.Time{}, StateTerminating, "deletion pending 10m"},
		{"deleting 2h", with(func(f *Facts) {
			f.Deleting = now.Add(-2 * time.Hour)
			f.Finalizers = []string{karpv1.TerminationFinalizer}
		}), true, time.Time{},
			StateStuckTerminating, "removes no finalizer"},
		{"deleting 2h inside a 3h terminationGracePeriod", with(func(f *Facts) {
			f.Deleting, f.TerminationGracePeriod = now.Add(-2*time.Hour), 3*time.Hour
		}), true, time.Time{}, StateTerminating, ""},
		{"deleting past its terminationGracePeriod plus the margin", with(func(f *Facts) {
			f.Deleting, f.TerminationGracePeriod = now.Add(-50*time.Minute), 30*time.Minute
		}), true, time.Time{}, StateStuckTerminating, "terminationGracePeriod"},
		{"only the Node deleting, a week", up, true, now.Add(-7 * 24 * time.Hour), StateStuckTerminating, "7d 0h"},
		{"launching", with(func(f *Facts) {
			f.Created, f.Registered, f.Initialized = now.Add(-5*time.Minute), Condition{Status: "Unknown"}, Condition{Status: "Unknown"}
		}), false, time.Time{}, StateLaunching, ""},
		{"never registered (c23)", with(func(f *Facts) {
			f.NodeName, f.Registered = "", Condition{Status: "False", Reason: "RegistrationTimeout"}
		}), false, time.Time{}, StateNotRegistered, "RegistrationTimeout"},
		{"no registration facts, young", Facts{Name: "nc", Created: now.Add(-time.Minute)}, false, time.Time{}, StateLaunching, ""},
		{"no registration facts, old", Facts{Name: "nc", Created: created}, false, time.Time{}, StateNotRegistered, ""},
		{"registered, Node gone", up, false, time.Time{}, StateNoNode, `Node "n" does not exist`},
		{"initializing", with(func(f *Facts) {
			f.Registered.Since, f.Initialized = now.Add(-5*time.Minute), Condition{Status: "False", Reason: "NotReady"}
		}), true, time.Time{}, StateInitializing, ""},
		{"not initialized past the grace", with(func(f *Facts) { f.Initialized = Condition{Status: "False", Reason: "StartupTaintsExist"} }), true, time.Time{},
			StateNotInitialized, "StartupTaintsExist"},
		{"conditions missing (old or simulated objects)", Facts{Name: "nc", NodeName: "n", Created: created}, true, time.Time{}, StateActive, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := Classify(tt.f, tt.node, tt.nodeDeleting, now, Graces{})
			if c.State != tt.want || c.Stuck != tt.want.Stuck() || !strings.Contains(c.Detail, tt.detail) {
				t.Errorf("state %s stuck %v detail %q, want %s with %q", c.State, c.Stuck, c.Detail, tt.want, tt.detail)
			}
		})
	}
}

// TestStateRoles: which states are capacity and breaker members.
func TestStateRoles(t *testing.T) {
	t.Parallel()
	for _, s := range States() {
		capacity := s == StateActive || s == StateDrifted
		if s.Capacity() != capacity {
			t.Errorf("%s: capacity %v", s, s.Capacity())
		}
		leaving := s == StateTerminating || s == StateStuckTerminating
		if s.BreakerMember(false) != capacity || s.BreakerMember(true) != !leaving {
			t.Errorf("%s: breaker member %v idle, %v failing", s, s.BreakerMember(false), s.BreakerMember(true))
		}
	}
}

// TestFactsOf reads conditions from the status only (StatusConditions().Get
// would make up Unknown ones) and falls back to Karpenter's labels.
func TestFactsOf(t *testing.T) {
	t.Parallel()
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nc", Labels: map[string]string{karpv1.NodeRegisteredLabelKey: "true"}}}
	f := FactsOf(nc)
	if f.Registered.Status != "True" || f.Initialized.Status != "" || f.Launched.Status != "" {
		t.Fatalf("facts %+v", f)
	}
	nc.Status.Conditions = []status.Condition{{Type: karpv1.ConditionTypeInitialized, Status: metav1.ConditionFalse, Reason: "NotReady"},
		{Type: karpv1.ConditionTypeDrifted, Status: metav1.ConditionTrue, Reason: "NodePoolDrifted"}}
	d := metav1.NewTime(time.Unix(1e9, 0))
	nc.DeletionTimestamp, nc.Spec.TerminationGracePeriod = &d, &metav1.Duration{Duration: time.Hour}
	f = FactsOf(nc)
	if f.Initialized.Status != "False" || f.Initialized.Reason != "NotReady" || !f.Drifted || !f.Deleting.Equal(d.Time) || f.TerminationGracePeriod != time.Hour {
		t.Fatalf("facts %+v", f)
	}
}
