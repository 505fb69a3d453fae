package api

import (
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Repair is a ledger row as the API shows it. Times are RFC 3339 UTC; a
// zero time is omitted.
type Repair struct {
	ID                  int64          `json:"id"`
	Cluster             string         `json:"cluster"`
	Node                string         `json:"node"`
	NodeClaim           string         `json:"nodeClaim,omitempty"`
	NodeClaimUID        string         `json:"nodeClaimUID,omitempty"`
	NodePool            string         `json:"nodePool,omitempty"`
	Reason              string         `json:"reason"`
	FaultClass          string         `json:"faultClass"`
	RecommendedAction   string         `json:"recommendedAction"`
	ExecutedAction      string         `json:"executedAction,omitempty"`
	State               string         `json:"state"`
	DryRun              bool           `json:"dryRun"`
	TolerationStartedAt *time.Time     `json:"tolerationStartedAt,omitempty"`
	TolerationUntil     *time.Time     `json:"tolerationUntil,omitempty"`
	CreatedAt           time.Time      `json:"createdAt"`
	UpdatedAt           time.Time      `json:"updatedAt"`
	ClosedAt            *time.Time     `json:"closedAt,omitempty"`
	Detail              map[string]any `json:"detail,omitempty"`
	FindingIDs          []string       `json:"findingIDs"`
}

// AuditEntry is one repair transition: who (actor), why (reason), when.
type AuditEntry struct {
	ID     int64          `json:"id"`
	From   string         `json:"from,omitempty"`
	To     string         `json:"to"`
	Actor  string         `json:"actor"`
	Reason string         `json:"reason"`
	Detail map[string]any `json:"detail,omitempty"`
	At     time.Time      `json:"at"`
}

// Node is a node's stored state.
type Node struct {
	Cluster       string             `json:"cluster"`
	Name          string             `json:"name"`
	BootID        string             `json:"bootID,omitempty"`
	DriverVersion string             `json:"driverVersion,omitempty"`
	KernelVersion string             `json:"kernelVersion,omitempty"`
	AgentVersion  string             `json:"agentVersion,omitempty"`
	Heartbeat     *finding.Heartbeat `json:"heartbeat,omitempty"`
	LastSeen      *time.Time         `json:"lastSeen,omitempty"`
	NodePool      string             `json:"nodePool,omitempty"`
	Zone          string             `json:"zone,omitempty"`
	InstanceType  string             `json:"instanceType,omitempty"`
	NodeClaim     string             `json:"nodeClaim,omitempty"`
	// RemovedAt is when the controller saw the Kubernetes Node gone
	// (store.Node.Removed); nil while it is present.
	RemovedAt *time.Time `json:"removedAt,omitempty"`
}

// Diagnosis is a stored diagnosis.
type Diagnosis struct {
	ID              int64          `json:"id"`
	BootID          string         `json:"bootID,omitempty"`
	Reason          string         `json:"reason"`
	Severity        string         `json:"severity"`
	FaultClass      string         `json:"faultClass"`
	Action          string         `json:"action"`
	ConditionType   string         `json:"conditionType,omitempty"`
	CatalogVersion  string         `json:"catalogVersion"`
	FirstSeen       time.Time      `json:"firstSeen"`
	LastSeen        time.Time      `json:"lastSeen"`
	Active          bool           `json:"active"`
	EventRecordedAt *time.Time     `json:"eventRecordedAt,omitempty"`
	FindingIDs      []string       `json:"findingIDs"`
	Detail          map[string]any `json:"detail,omitempty"`
}

func opt(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func toRepair(r store.Repair) Repair {
	ids := r.FindingIDs
	if ids == nil {
		ids = []string{}
	}
	return Repair{ID: r.ID, Cluster: r.Cluster, Node: r.Node, NodeClaim: r.NodeClaim, NodeClaimUID: r.NodeClaimUID,
		NodePool: r.NodePool, Reason: r.Reason, FaultClass: r.FaultClass, RecommendedAction: r.RecommendedAction,
		ExecutedAction: r.ExecutedAction, State: string(r.State), DryRun: r.DryRun,
		TolerationStartedAt: opt(r.TolerationStartedAt), TolerationUntil: opt(r.TolerationUntil),
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ClosedAt: opt(r.ClosedAt), Detail: r.Detail, FindingIDs: ids}
}

func toAudit(a store.AuditEntry) AuditEntry {
	return AuditEntry{ID: a.ID, From: string(a.From), To: string(a.To), Actor: a.Actor, Reason: a.Reason, Detail: a.Detail, At: a.At}
}

func toNode(n store.Node) Node {
	out := Node{Cluster: n.Cluster, Name: n.Name, BootID: n.BootID, DriverVersion: n.DriverVersion, KernelVersion: n.KernelVersion,
		AgentVersion: n.AgentVersion, Heartbeat: n.Heartbeat, LastSeen: opt(n.LastSeen), NodePool: n.NodePool, Zone: n.Zone,
		InstanceType: n.InstanceType, NodeClaim: n.NodeClaim}
	if n.Removed() {
		out.RemovedAt = opt(n.RemovedAt)
	}
	return out
}

func toDiagnosis(d store.DiagnosisRecord) Diagnosis {
	ids := d.FindingIDs
	if ids == nil {
		ids = []string{}
	}
	return Diagnosis{ID: d.ID, BootID: d.BootID, Reason: d.Reason, Severity: d.Severity, FaultClass: d.FaultClass,
		Action: d.Action, ConditionType: d.ConditionType, CatalogVersion: d.CatalogVersion, FirstSeen: d.FirstSeen,
		LastSeen: d.LastSeen, Active: d.Active, EventRecordedAt: opt(d.EventRecordedAt), FindingIDs: ids, Detail: d.Detail}
}
