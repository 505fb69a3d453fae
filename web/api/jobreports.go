package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// JobReportResponse is the body of a successful POST /api/v1/job-reports.
type JobReportResponse struct {
	// Failures is how many failures the report held, Findings how many
	// findings they made (two per failure whose peer is a known node, one
	// otherwise) and Inserted how many of those were new (a resend: 0).
	Failures int `json:"failures"`
	Findings int `json:"findings"`
	Inserted int `json:"inserted"`
	// Nodes are the nodes that got new findings (they are reconciled now).
	Nodes []string `json:"nodes"`
	// UnresolvedPeers are peer addresses no Node of the cluster holds: only
	// the reporting end was filed for them.
	UnresolvedPeers []string `json:"unresolvedPeers,omitempty"`
	// UnknownNodes are reporting nodes (failures[].node) that are no Node
	// of the cluster: no Kubernetes Node holds the name (Config.PeerNodes)
	// and no agent or reconcile stored it (store.PresentNodes). Their
	// findings are filed, but nothing reconciles them to a real node: the
	// reporter named a host, not its Node (report-job --node, --host).
	UnknownNodes []string `json:"unknownNodes,omitempty"`
	// FabricIncident is true when the failures spread over many node pairs
	// at once (finding.FabricIncident): the findings say so and the
	// diagnosis counts them towards no node's condition; Pairs is how many.
	FabricIncident bool `json:"fabricIncident"`
	Pairs          int  `json:"pairs"`
}

// jobReport serves POST /api/v1/job-reports: a job-failure report
// (finding.JobReport) from a Slurm epilog, a Kubeflow hook or a CI job,
// authenticated like an operator (a bearer token of role reporter,
// approver or admin; auth.RoleReporter). The body is decoded strictly
// (unknown fields, trailing data and values out of bounds are 400 with
// every problem listed) and must be for a cluster this controller serves.
// Peers named by address are resolved to Nodes (Config.PeerNodes). The
// findings go to the store without touching the nodes' agent facts, and
// every node that got a new one is reconciled (Config.OnIngest). A store
// failure is 503 with Retry-After: the reporter resends; the findings'
// IDs make the resend idempotent.
func (s *server) jobReport(w http.ResponseWriter, r *http.Request) {
	op, ok := s.operator(w, r, auth.RoleReporter)
	if !ok {
		return
	}
	var rep finding.JobReport
	if err := decodeStrict(w, r, MaxReportBytes, &rep); err != nil {
		if limit, ok := tooLarge(err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, "report too large", fmt.Sprintf("the body is over %d bytes: split the failures over several reports", limit), nil)
			return
		}
		writeError(w, http.StatusBadRequest, "malformed job report", err.Error(), nil)
		return
	}
	now := s.cfg.Now()
	if err := rep.Validate(now); err != nil {
		var ve *finding.ValidationError
		if errors.As(err, &ve) {
			writeError(w, http.StatusBadRequest, "invalid job report", "", ve.Problems)
			return
		}
		writeError(w, http.StatusBadRequest, "invalid job report", err.Error(), nil)
		return
	}
	var old []string
	for i, f := range rep.Failures {
		if f.Time.Before(MinFindingTime) {
			old = append(old, fmt.Sprintf("failures[%d].time: %s is before %s (a clock never set): give the failure's time, or none for the job's end",
				i, f.Time.UTC().Format(time.RFC3339), MinFindingTime.Format("2006-01-02")))
		}
	}
	if len(old) > 0 {
		writeError(w, http.StatusBadRequest, "invalid job report", "", old)
		return
	}
	if !s.serves(rep.Cluster) {
		writeError(w, http.StatusBadRequest, "invalid job report", "", []string{fmt.Sprintf("cluster: %q is not served by this controller (GET /api/v1/clusters)", rep.Cluster)})
		return
	}
	peers, err := s.peerNodes(r.Context(), rep.Cluster)
	if err != nil {
		s.cfg.Log.WarnContext(r.Context(), "job report: cannot resolve peer addresses; filing the reporting ends only", "cluster", rep.Cluster, "err", err)
	}
	unresolved := map[string]bool{}
	fs := rep.Findings(func(addr string) string {
		n := peers[addr]
		if n == "" {
			unresolved[addr] = true
		}
		return n
	})
	res, err := s.storeJob(r.Context(), rep.Cluster, fs)
	if err != nil {
		s.writeIngestError(w, r, err)
		return
	}
	unknown := s.unknownNodes(r.Context(), rep, peers)
	fabric, pairs := finding.FabricIncident(rep.Failures)
	s.cfg.Log.InfoContext(r.Context(), "job report stored", "cluster", rep.Cluster, "job", rep.Job.ID, "source", rep.Job.Source,
		"operator", op.Name, "failures", len(rep.Failures), "inserted", res.Inserted, "fabric_incident", fabric)
	if s.cfg.OnIngest != nil {
		for _, n := range res.Nodes {
			s.cfg.OnIngest(rep.Cluster, n)
		}
	}
	out := JobReportResponse{Failures: len(rep.Failures), Findings: len(fs), Inserted: res.Inserted, Nodes: res.Nodes,
		FabricIncident: fabric, Pairs: pairs}
	if out.Nodes == nil {
		out.Nodes = []string{}
	}
	if len(unknown) > 0 {
		out.UnknownNodes = unknown
		s.cfg.Log.WarnContext(r.Context(), "job report names nodes no Node of the cluster is", "cluster", rep.Cluster, "job", rep.Job.ID, "nodes", unknown)
	}
	for a := range unresolved {
		out.UnresolvedPeers = append(out.UnresolvedPeers, a)
	}
	sort.Strings(out.UnresolvedPeers)
	writeJSON(w, http.StatusOK, out)
}

// unknownNodes returns, sorted, the report's reporting nodes that neither a
// Kubernetes Node of the cluster (the values of peers, Config.PeerNodes)
// nor a present stored node holds. A failed look-up is logged and names
// none: the warning is advice, the findings are stored either way.
func (s *server) unknownNodes(ctx context.Context, rep finding.JobReport, peers map[string]string) []string {
	inKube := make(map[string]bool, len(peers))
	for _, n := range peers {
		inKube[n] = true
	}
	var ask []string
	seen := map[string]bool{}
	for _, f := range rep.Failures {
		if !seen[f.Node] && !inKube[f.Node] {
			seen[f.Node] = true
			ask = append(ask, f.Node)
		}
	}
	if len(ask) == 0 {
		return nil
	}
	present, err := s.cfg.Store.PresentNodes(ctx, rep.Cluster, ask)
	if err != nil {
		s.cfg.Log.WarnContext(ctx, "job report: cannot check the reporting nodes", "cluster", rep.Cluster, "err", err)
		return nil
	}
	var out []string
	for _, n := range ask {
		if !present[n] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// peerNodes maps the cluster's Node addresses to Node names
// (Config.PeerNodes; nil: no resolution).
func (s *server) peerNodes(ctx context.Context, cluster string) (map[string]string, error) {
	if s.cfg.PeerNodes == nil {
		return nil, nil
	}
	return s.cfg.PeerNodes(ctx, cluster)
}

// storeJob writes a job report's findings within IngestTimeout, holding
// one of the MaxIngestInFlight slots like an agent's report.
func (s *server) storeJob(ctx context.Context, cluster string, fs []finding.Finding) (store.JobIngestResult, error) {
	select {
	case s.ingestSlots <- struct{}{}:
		defer func() { <-s.ingestSlots }()
	default:
		return store.JobIngestResult{}, errOverloaded
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.IngestTimeout)
	defer cancel()
	return s.cfg.Store.IngestJobFindings(ctx, cluster, fs, s.cfg.Now())
}
