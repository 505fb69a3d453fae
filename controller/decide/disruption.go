package decide

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Owners' word on disruption (docs/design.md, "Do-not-disrupt and
// opt-out").
const (
	// DoNotDisruptAnnotation is Karpenter's annotation
	// (sigs.k8s.io/karpenter/pkg/apis/v1 DoNotDisruptAnnotationKey). On a
	// Node or NodeClaim, "true" blocks Karpenter's voluntary disruption; on
	// a Pod, "true" or a duration since the pod started ("30m") blocks its
	// eviction. fleetrepair holds a NodeClaim deletion while the Node, its
	// NodeClaim or an active Pod on it carries it.
	DoNotDisruptAnnotation = "karpenter.sh/do-not-disrupt"
	// OptOutLabel with value OptOutDisabled on a Node or its NodePool opts
	// the node out of replacement by fleetrepair: diagnoses, NodeConditions
	// and the quarantine taint still apply, the NodeClaim is never deleted.
	OptOutLabel    = "fleetrepair.dev/repair"
	OptOutDisabled = "disabled"
)

// Disruption is what a node's owners said about disrupting it, gathered by
// the caller before the deletion guards run (live: the Node, its NodeClaim,
// its NodePool and its Pods read from the API server; the shadow: what the
// controller last recorded; the simulator: the node's attributes).
type Disruption struct {
	// OptOut names where OptOutLabel=disabled is set ("Node n1",
	// "NodePool gpu"); "" when nowhere.
	OptOut string
	// DoNotDisrupt names the object carrying an active
	// DoNotDisruptAnnotation ("Node n1", "NodeClaim n1-abcde",
	// "Pod ml/train-0"); "" when none does.
	DoNotDisrupt string
}

// Errors of the owners' guard: both hold the deletion and are retried at
// every pass until the owner lifts them; an on-call approval does not
// override them (the owner removes the annotation or label, or on-call
// deletes the NodeClaim by hand).
var (
	ErrDoNotDisrupt = errors.New("held by " + DoNotDisruptAnnotation)
	ErrOptedOut     = errors.New("opted out of repair by " + OptOutLabel + "=" + OptOutDisabled)
)

// check returns the owners' refusal of a deletion, nil when none.
func (d Disruption) check() error {
	switch {
	case d.OptOut != "":
		return fmt.Errorf("%s: %w", d.OptOut, ErrOptedOut)
	case d.DoNotDisrupt != "":
		return fmt.Errorf("%s: %w", d.DoNotDisrupt, ErrDoNotDisrupt)
	}
	return nil
}

// OptedOut reports whether labels (a Node's or a NodePool's) opt out of
// repair: OptOutLabel is "disabled" (any case).
func OptedOut(labels map[string]string) bool {
	return strings.EqualFold(labels[OptOutLabel], OptOutDisabled)
}

// ObjectDoNotDisrupt reports whether a Node's or NodeClaim's annotations
// block disruption: DoNotDisruptAnnotation is exactly "true", as Karpenter
// reads it on those objects.
func ObjectDoNotDisrupt(annotations map[string]string) bool {
	return annotations[DoNotDisruptAnnotation] == "true"
}

// PodDoNotDisrupt reports whether a Pod's DoNotDisruptAnnotation value
// protects it at now, as Karpenter v1.14 reads it
// (pkg/utils/pod IsDoNotDisruptActive): "true" always; a Go duration
// ("30m", "2h") while now is before started+duration, and always when the
// start time is unknown (zero; fail safe); any other value (absent,
// "false", unparsable) does not protect. Terminal and terminating pods are
// the caller's to skip (Karpenter's IsActive).
func PodDoNotDisrupt(value string, started, now time.Time) bool {
	if value == "true" {
		return true
	}
	d, err := time.ParseDuration(value)
	if err != nil || d <= 0 {
		return false
	}
	return started.IsZero() || now.Before(started.Add(d))
}

// Holds name why a Guard step waits (Next.Hold): the ledger records each
// once when it starts, and a Kubernetes Event tells the node's story.
const (
	HoldBudget       = "budget"
	HoldMinHealthy   = "min-healthy"
	HoldKillSwitch   = "kill-switch"
	HoldDoNotDisrupt = "do-not-disrupt"
	HoldOptOut       = "opt-out"
)

// HoldOf names the hold of a deletion guard error (one of the Hold*
// names), "" for no guard hold (nil, a stale breaker state: a retry, not a
// hold; a breaker: the repair goes to on-call instead).
func HoldOf(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrKillSwitch):
		return HoldKillSwitch
	case errors.Is(err, ErrOptedOut):
		return HoldOptOut
	case errors.Is(err, ErrDoNotDisrupt):
		return HoldDoNotDisrupt
	case errors.Is(err, ErrMinHealthy):
		return HoldMinHealthy
	case errors.Is(err, ErrBudgetExceeded):
		return HoldBudget
	}
	return ""
}
