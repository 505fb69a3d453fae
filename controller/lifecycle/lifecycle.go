// Package lifecycle turns Kubernetes' and Karpenter's own view of a node's
// life (a Node or NodeClaim being deleted, a NodeClaim whose Registered or
// Initialized condition is not True, a drifted NodeClaim) into findings.
//
// These are lifecycle facts, never health faults: the diagnosis maps them to
// severity-none reasons (NodeTerminating, NodeClaimNotRegistered) that open
// no repair, send no second delete and strip no finalizer; a terminating
// node is not healthy capacity (Terminating). Findings carry no ID; callers
// stamp them (finding.NewID).
package lifecycle

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Terminating reports whether a Node is already leaving (it carries a
// deletionTimestamp): it counts as neither healthy capacity nor a breaker
// cohort member.
func Terminating(n *corev1.Node) bool { return n.DeletionTimestamp != nil }

// NodeFindings returns the lifecycle findings of a Node: node-terminating
// while it carries a deletionTimestamp (attr deletion_timestamp, RFC 3339).
func NodeFindings(n *corev1.Node) []finding.Finding {
	if n.DeletionTimestamp == nil {
		return nil
	}
	return []finding.Finding{TerminatingFinding(n.Name, n.DeletionTimestamp.Time, n.Finalizers)}
}

// TerminatingFinding is the node-terminating finding of a Node named node
// whose deletionTimestamp is deleting.
func TerminatingFinding(node string, deleting time.Time, finalizers []string) finding.Finding {
	ts := deleting.UTC().Format(time.RFC3339)
	return finding.Finding{Detector: finding.DetectorNodeTerminating, Node: node, Count: 1, Time: deleting.UTC(),
		Attrs:    map[string]string{finding.AttrDeletionTimestamp: ts, finding.AttrFinalizers: strings.Join(finalizers, ",")},
		Evidence: []string{fmt.Sprintf("Node %s deletionTimestamp=%s finalizers=%v", node, ts, finalizers)}}
}

// NodeClaimFindings returns the lifecycle finding of a NodeClaim, or none
// when it is simply healthy (Launched, Registered, Initialized all True, not
// drifted, not deleting): nodeclaim-status with the status of each lifecycle
// condition (launched, registered, initialized, ready: True|False|Unknown,
// and <type>_reason when not True), drifted, deletion_timestamp and
// finalizers. A condition missing from the status is left out.
func NodeClaimFindings(nc *karpv1.NodeClaim) []finding.Finding {
	attrs := map[string]string{}
	healthy := true
	for _, typ := range []string{karpv1.ConditionTypeLaunched, karpv1.ConditionTypeRegistered, karpv1.ConditionTypeInitialized, "Ready"} {
		c := nc.StatusConditions().Get(typ)
		if c == nil {
			continue
		}
		k := strings.ToLower(typ)
		attrs[k] = string(c.Status)
		if c.Status != "True" {
			healthy = false
			if c.Reason != "" {
				attrs[k+"_reason"] = c.Reason
			}
		}
	}
	if c := nc.StatusConditions().Get(karpv1.ConditionTypeDrifted); c != nil && c.Status == "True" {
		attrs["drifted"], healthy = "true", false
	}
	at := time.Time{}
	if nc.DeletionTimestamp != nil {
		at = nc.DeletionTimestamp.UTC()
		attrs[finding.AttrDeletionTimestamp] = at.Format(time.RFC3339)
		attrs[finding.AttrFinalizers] = strings.Join(nc.Finalizers, ",")
		healthy = false
	}
	if healthy {
		return nil
	}
	node := nc.Status.NodeName
	return []finding.Finding{{Detector: finding.DetectorNodeClaimStatus, Node: node, Count: 1, Time: at, Attrs: attrs,
		Evidence: []string{fmt.Sprintf("NodeClaim %s %v", nc.Name, attrs)}}}
}

// bareAlias is a YAML value that is a bare "*..." token: an alias in YAML's
// grammar, but in saved objects a masked value ("name: ***", c27).
var bareAlias = regexp.MustCompile(`(?m)^(\s*(?:- )?[^\s#:][^:#]*:\s+)(\*[^\s'"]*)\s*$`)

// DecodeLenient decodes a saved Kubernetes object (YAML or JSON) into v,
// reading a bare "*..." value that no anchor defines as the string it
// shows, as "kubectl get -o yaml" output edited by hand often has.
func DecodeLenient(data []byte, v any) error {
	if !bytes.Contains(data, []byte("&")) {
		data = bareAlias.ReplaceAll(data, []byte(`$1'$2'`))
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode object: %w", err)
	}
	return nil
}
