package finding

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// A JobReport is what a job saw fail on the network between nodes, sent by
// the job's own machinery when it ends (a Slurm epilog, a Kubeflow
// training-operator hook, a CI job: POST /api/v1/job-reports, with an
// operator token of role reporter or above). It names, per failure, the
// reporting node, its NIC and the peer (a node, an address, or both), so
// the controller can file the failure against both ends: a job's NCCL
// "Got completion from peer" error says a path failed, and either end or
// the switch path between them can be at fault (c29).
//
// The controller turns each failure into two findings (JobReport.Findings):
// one on the reporting node and one on the peer node, when the peer is
// known. The diagnosis files them as events; a condition needs the same
// node failing across jobs and peers; many node pairs failing in one
// report at once are the fabric (FabricIncident), not the nodes.
type JobReport struct {
	// SchemaVersion must be SchemaVersion.
	SchemaVersion string `json:"schemaVersion"`
	// Cluster is the cluster the job ran in, as the controller knows it.
	Cluster string `json:"cluster"`
	Job     Job    `json:"job"`
	// Failures are the network failures the job saw (1..MaxJobFailures).
	Failures []JobFailure `json:"failures"`
}

// Job identifies one run of a job.
type Job struct {
	// ID is the scheduler's identity of this run, unique across runs and
	// stable for resends ("slurm/4242", "kubeflow/ns/pytorchjob-a/uid",
	// "ci/pipeline-991/job-3"): with the failure's facts it is the
	// findings' idempotency key. 1..128 printable characters.
	ID string `json:"id"`
	// Source is who reports: JobSourceSlurm, JobSourceKubeflow, JobSourceCI
	// or JobSourceOther.
	Source string `json:"source"`
	// Name is the job's human name, optional (at most 253 characters).
	Name string `json:"name,omitempty"`
}

// Job sources.
const (
	JobSourceSlurm    = "slurm"
	JobSourceKubeflow = "kubeflow"
	JobSourceCI       = "ci"
	JobSourceOther    = "other"
)

// Job failure kinds (JobFailure.Kind). Only NCCL's network errors for now;
// the kind names the detector of the findings made of it.
const (
	JobFailureNCCLNet = DetectorNCCLNetError
)

// JobFailure is one failure between the reporting node and a peer.
type JobFailure struct {
	// Kind is the failure kind (JobFailure* constants).
	Kind string `json:"kind"`
	// Node is the Kubernetes Node name of the reporting end (required).
	Node string `json:"node"`
	// NIC is the reporting end's NIC: an HCA name (mlx5_26), an interface
	// or a GID, as the job printed it; optional, at most 128 characters.
	NIC string `json:"nic,omitempty"`
	// Peer is the other end: its Node name, its address, or both; one is
	// required. An address alone is resolved by the controller to the Node
	// holding it (its InternalIP addresses), when one does.
	Peer JobPeer `json:"peer"`
	// Time is when the failure happened (required: every finding has a
	// time; a job log's lines carry one, or the job's end is used).
	Time time.Time `json:"time"`
	// Count is how many times the job saw it (>= 1; 0 reads as 1).
	Count int `json:"count,omitempty"`
	// Status and VendorErr are the ibverbs completion status and the HCA's
	// vendor error, when the job printed them (NCCL's "status=12 ... vendor
	// err 129"); -1 or absent when unknown.
	Status    *int `json:"status,omitempty"`
	VendorErr *int `json:"vendorErr,omitempty"`
	// Evidence are the job's own log lines, unchanged (at most
	// MaxJobEvidence lines of MaxEvidenceLine bytes).
	Evidence []string `json:"evidence,omitempty"`
}

// JobPeer is the other end of a failure.
type JobPeer struct {
	Node    string `json:"node,omitempty"`
	Address string `json:"address,omitempty"` // an IPv4 or IPv6 address, no port
	NIC     string `json:"nic,omitempty"`
}

// Bounds of a JobReport, checked by Validate.
const (
	MaxJobFailures  = 1000
	MaxJobEvidence  = 16
	MaxEvidenceLine = 4096
	// MaxJobClockSkew is how far in the future of the controller's clock a
	// failure's time may be.
	MaxJobClockSkew = 5 * time.Minute
)

// Attribute keys of findings made from a JobReport (on top of the
// nccl-net-error ones: peer, hca, status, vendor_err).
const (
	AttrJob            = "job"             // the job run's ID
	AttrJobSource      = "job_source"      // slurm, kubeflow, ci, other
	AttrJobName        = "job_name"        // the job's name, when given
	AttrPeerNode       = "peer_node"       // the other end's Node name, when known
	AttrPeerHCA        = "peer_hca"        // the other end's NIC, when given
	AttrEnd            = "end"             // EndReporter or EndPeer: which end of the failure this node is
	AttrFabricIncident = "fabric_incident" // "true": the report's failures spread over many node pairs at once (FabricIncident)
	AttrFabricPairs    = "fabric_pairs"    // fabric incident: how many distinct node pairs failed in the report
)

// Ends of a failure (AttrEnd).
const (
	EndReporter = "reporter"
	EndPeer     = "peer"
)

// Validate checks a JobReport before anything of it is stored, at now (a
// failure more than MaxJobClockSkew in the future is refused). It returns a
// *ValidationError listing every problem, or nil.
func (r *JobReport) Validate(now time.Time) error {
	var p []string
	if r.SchemaVersion != SchemaVersion {
		p = append(p, fmt.Sprintf("schemaVersion: %q is not supported (supported: %q)", r.SchemaVersion, SchemaVersion))
	}
	if err := CheckName(r.Cluster); err != nil {
		p = append(p, "cluster: "+err.Error())
	}
	if err := checkText(r.Job.ID, 128); err != nil || r.Job.ID == "" {
		if err == nil {
			err = fmt.Errorf("required")
		}
		p = append(p, "job.id: "+err.Error())
	}
	switch r.Job.Source {
	case JobSourceSlurm, JobSourceKubeflow, JobSourceCI, JobSourceOther:
	default:
		p = append(p, fmt.Sprintf("job.source: %q is not one of slurm, kubeflow, ci, other", r.Job.Source))
	}
	if err := checkText(r.Job.Name, MaxNameLength); err != nil {
		p = append(p, "job.name: "+err.Error())
	}
	switch n := len(r.Failures); {
	case n == 0:
		p = append(p, "failures: at least one failure is required")
	case n > MaxJobFailures:
		p = append(p, fmt.Sprintf("failures: %d failures exceed the limit of %d per report", n, MaxJobFailures))
	}
	for i, f := range r.Failures {
		if i >= MaxJobFailures {
			break
		}
		at := fmt.Sprintf("failures[%d]", i)
		if f.Kind != JobFailureNCCLNet {
			p = append(p, fmt.Sprintf("%s.kind: %q is not a job failure kind (supported: %q)", at, f.Kind, JobFailureNCCLNet))
		}
		if err := CheckName(f.Node); err != nil {
			p = append(p, at+".node: "+err.Error())
		}
		if err := checkText(f.NIC, 128); err != nil {
			p = append(p, at+".nic: "+err.Error())
		}
		if err := checkText(f.Peer.NIC, 128); err != nil {
			p = append(p, at+".peer.nic: "+err.Error())
		}
		switch {
		case f.Peer.Node == "" && f.Peer.Address == "":
			p = append(p, at+".peer: a node or an address is required")
		case f.Peer.Node != "" && CheckName(f.Peer.Node) != nil:
			p = append(p, at+".peer.node: "+CheckName(f.Peer.Node).Error())
		case f.Peer.Node == f.Node:
			p = append(p, at+".peer.node: the peer is the reporting node itself")
		}
		if f.Peer.Address != "" {
			if a, err := netip.ParseAddr(f.Peer.Address); err != nil || a.Zone() != "" {
				p = append(p, fmt.Sprintf("%s.peer.address: %q is not an IP address (no port, no zone)", at, f.Peer.Address))
			}
		}
		switch {
		case f.Time.IsZero():
			p = append(p, at+".time: required (RFC 3339: when the job saw the failure)")
		case f.Time.After(now.Add(MaxJobClockSkew)):
			p = append(p, fmt.Sprintf("%s.time: %s is in the future", at, f.Time.UTC().Format(time.RFC3339)))
		}
		if f.Count < 0 || f.Count > MaxCount {
			p = append(p, fmt.Sprintf("%s.count: must be 1..%d", at, MaxCount))
		}
		for _, v := range []struct {
			name string
			v    *int
		}{{"status", f.Status}, {"vendorErr", f.VendorErr}} {
			if v.v != nil && (*v.v < -1 || *v.v > 1<<16) {
				p = append(p, fmt.Sprintf("%s.%s: %d is out of range", at, v.name, *v.v))
			}
		}
		if len(f.Evidence) > MaxJobEvidence {
			p = append(p, fmt.Sprintf("%s.evidence: %d lines exceed the limit of %d", at, len(f.Evidence), MaxJobEvidence))
		}
		for j, e := range f.Evidence {
			if len(e) > MaxEvidenceLine || !utf8.ValidString(e) || strings.IndexByte(e, 0) >= 0 {
				p = append(p, fmt.Sprintf("%s.evidence[%d]: not a text line of at most %d bytes", at, j, MaxEvidenceLine))
			}
		}
	}
	if len(p) > 0 {
		return &ValidationError{Problems: p}
	}
	return nil
}

// checkText accepts "" or up to max bytes of printable UTF-8 without
// control or bidirectional-override characters.
func checkText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("longer than %d characters", max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("not UTF-8")
	}
	for _, c := range s {
		if !unicode.IsPrint(c) || unicode.Is(unicode.Bidi_Control, c) {
			return fmt.Errorf("%q holds a control character", s)
		}
	}
	return nil
}

// FabricPairs is how many distinct node pairs must fail in one report, with
// no node in more than half of them, for the report to be a fabric
// incident (FabricIncident).
const FabricPairs = 4

// FabricIncident reports whether a report's failures are the fabric rather
// than its nodes: at least FabricPairs distinct node pairs (unordered; a
// peer known by address only counts as that address) fail at once, and no
// single node is an end of more than half of them (one bad NIC failing
// with every peer is that node's, not the fabric's). It returns the number
// of distinct pairs too.
func FabricIncident(fs []JobFailure) (bool, int) {
	pairs := map[[2]string]bool{}
	for _, f := range fs {
		peer := f.Peer.Node
		if peer == "" {
			peer = f.Peer.Address
		}
		k := [2]string{f.Node, peer}
		if k[1] < k[0] {
			k[0], k[1] = k[1], k[0]
		}
		pairs[k] = true
	}
	if len(pairs) < FabricPairs {
		return false, len(pairs)
	}
	ends := map[string]int{}
	for k := range pairs {
		ends[k[0]]++
		ends[k[1]]++
	}
	for _, n := range ends {
		if 2*n > len(pairs) {
			return false, len(pairs)
		}
	}
	return true, len(pairs)
}

// Findings turns the report into findings, two per failure: one on the
// reporting node (AttrEnd reporter, AttrPeer the peer's address, else its
// node) and one on the peer node when it is known (AttrEnd peer, AttrPeer
// the reporting node), both detector Kind, with the job's identity, the
// NICs, status and vendor error as attributes and the failure's time.
// peerNode resolves a peer address to a Node name ("" when none holds it;
// nil: no resolution). IDs are stable for a resent report.
func (r *JobReport) Findings(peerNode func(address string) string) []Finding {
	fabric, pairs := FabricIncident(r.Failures)
	out := make([]Finding, 0, 2*len(r.Failures))
	for _, f := range r.Failures {
		peer := f.Peer.Node
		if peer == "" && peerNode != nil && f.Peer.Address != "" {
			peer = peerNode(f.Peer.Address)
		}
		count := max(f.Count, 1)
		base := map[string]string{AttrJob: r.Job.ID, AttrJobSource: r.Job.Source}
		if r.Job.Name != "" {
			base[AttrJobName] = r.Job.Name
		}
		if f.Status != nil && *f.Status >= 0 {
			base[AttrStatus] = strconv.Itoa(*f.Status)
		}
		if f.VendorErr != nil && *f.VendorErr >= 0 {
			base[AttrVendorErr] = strconv.Itoa(*f.VendorErr)
		}
		if fabric {
			base[AttrFabricIncident], base[AttrFabricPairs] = "true", strconv.Itoa(pairs)
		}
		evidence := slices.Clone(f.Evidence)
		if len(evidence) == 0 {
			evidence = []string{fmt.Sprintf("job %s (%s): %s between %s %s and %s %s %s", r.Job.ID, r.Job.Source, f.Kind,
				f.Node, f.NIC, f.Peer.Node, f.Peer.Address, f.Peer.NIC)}
		}
		mine := cloneAttrs(base)
		mine[AttrEnd] = EndReporter
		mine[AttrPeer] = f.Peer.Address
		if mine[AttrPeer] == "" {
			mine[AttrPeer] = peer
		}
		setIf(mine, AttrPeerNode, peer)
		setIf(mine, AttrHCA, f.NIC)
		setIf(mine, AttrPeerHCA, f.Peer.NIC)
		out = append(out, jobFinding(r, f, EndReporter, f.Node, count, mine, evidence))
		if peer == "" {
			continue
		}
		theirs := cloneAttrs(base)
		theirs[AttrEnd], theirs[AttrPeer], theirs[AttrPeerNode] = EndPeer, f.Node, f.Node
		setIf(theirs, AttrHCA, f.Peer.NIC)
		setIf(theirs, AttrPeerHCA, f.NIC)
		out = append(out, jobFinding(r, f, EndPeer, peer, count, theirs, evidence))
	}
	return out
}

// jobFinding makes one end's finding of a failure. Its ID, the idempotency
// key of a resent report, derives from the job's identity (source, ID) and
// the failure: its ends, NIC and the job's own log lines (Evidence). The
// failure's time enters it only when the failure carries no log line (a
// JSON report's failure, whose time the reporter gives): a log line
// without a timestamp is placed at the time of the report-job run (or
// --time), which differs between resends, and must not make a second
// finding of the same line.
func jobFinding(r *JobReport, f JobFailure, end, node string, count int, attrs map[string]string, evidence []string) Finding {
	h := sha256.New()
	parts := []string{"job-report", r.Job.Source, r.Job.ID, end, node, f.Kind, f.Node, f.Peer.Node, f.Peer.Address, f.NIC}
	if len(f.Evidence) == 0 {
		parts = append(parts, f.Time.UTC().Format(time.RFC3339Nano))
	}
	parts = append(parts, f.Evidence...)
	for _, s := range parts {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return Finding{ID: "job-" + hex.EncodeToString(h.Sum(nil))[:28], Detector: f.Kind, Node: node, Time: f.Time.UTC(), Count: count,
		Attrs: attrs, Evidence: evidence}
}

func cloneAttrs(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+6)
	for k, v := range m {
		out[k] = v
	}
	return out
}

func setIf(m map[string]string, k, v string) {
	if v != "" {
		m[k] = v
	}
}
