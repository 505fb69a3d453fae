package ui

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// fleetData is the fleet page: GET /api/v1/fleet plus one page of
// GET /api/v1/nodes (the search, or the nodes that need attention).
type fleetData struct {
	Fleet api.Fleet
	Nodes api.NodeList
	Query api.NodeQuery
	// NextURL continues the node list ("" on its last page).
	NextURL string
}

func (d *dashboard) fleet(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	nq := api.NodeQuery{Cluster: q.Get("cluster"), NodePool: q.Get("nodepool"), Search: strings.TrimSpace(q.Get("q")),
		Health: q.Get("health"), Cursor: q.Get("cursor"), Limit: 50}
	if nq.Search == "" && nq.Health == "" && nq.Cluster == "" && nq.NodePool == "" {
		nq.Health = "attention" // the default list: what is not ok
	}
	f, err := d.cfg.API.Fleet(r.Context())
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	nodes, err := d.cfg.API.Nodes(r.Context(), nq)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	data := fleetData{Fleet: f, Nodes: nodes, Query: nq}
	if nodes.NextCursor != "" {
		nv := url.Values{}
		for k, v := range map[string]string{"cluster": nq.Cluster, "nodepool": nq.NodePool, "q": nq.Search, "health": nq.Health, "cursor": nodes.NextCursor} {
			if v != "" {
				nv.Set(k, v)
			}
		}
		data.NextURL = "/fleet?" + nv.Encode()
	}
	d.render(w, r, http.StatusOK, "fleet", data, d.live("Fleet", r.URL.RequestURI(), "/api/v1/fleet"))
}

func (d *dashboard) approvals(w http.ResponseWriter, r *http.Request) {
	a, err := d.cfg.API.Approvals(r.Context())
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "approvals", a, d.live("Approvals", "/approvals", "/api/v1/approvals"))
}

func repairID(r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
	return id, err == nil && id > 0
}

// decide is the approve/reject button: Service.Decide, the code path of
// POST /api/v1/repairs/{id}/approve|reject.
func (d *dashboard) decide(w http.ResponseWriter, r *http.Request) {
	id, ok := repairID(r)
	if !ok {
		d.fail(w, r, http.StatusBadRequest, "invalid repair id", chi.URLParam(r, "id"))
		return
	}
	to := ledger.Approved
	if chi.URLParam(r, "decision") == "reject" {
		to = ledger.Rejected
	}
	rp, err := d.cfg.API.Decide(r.Context(), d.caller(r), id, to, r.PostFormValue("reason"))
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	d.flash(r.Context(), fmt.Sprintf("repair %d of node %s: %s", rp.ID, rp.Node, rp.State))
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

// bulkData is the confirmation page of a bulk approval.
type bulkData struct {
	IDs    []int64
	Reason string
	Group  string
}

// bulkApprove approves many held repairs: the first POST shows the exact
// count and asks for confirmation; the second, carrying confirm = that
// count, approves each through Service.Decide.
func (d *dashboard) bulkApprove(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		d.fail(w, r, http.StatusBadRequest, "malformed form", err.Error())
		return
	}
	var ids []int64
	for _, v := range r.PostForm["id"] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			d.fail(w, r, http.StatusBadRequest, "invalid repair id", v)
			return
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if len(ids) == 0 || reason == "" {
		d.fail(w, r, http.StatusBadRequest, "invalid bulk approval", "select at least one repair and give a reason")
		return
	}
	if r.PostFormValue("confirm") != strconv.Itoa(len(ids)) {
		d.render(w, r, http.StatusOK, "confirm", bulkData{IDs: ids, Reason: reason, Group: r.PostFormValue("group")},
			func(p *page) { p.Title = fmt.Sprintf("Approve %d repairs?", len(ids)) })
		return
	}
	var done, failed []string
	for _, id := range ids {
		if _, err := d.cfg.API.Decide(r.Context(), d.caller(r), id, ledger.Approved, reason); err != nil {
			if api.StatusOf(err) == http.StatusForbidden {
				d.failErr(w, r, err)
				return
			}
			failed = append(failed, fmt.Sprintf("%d (%v)", id, err))
			continue
		}
		done = append(done, strconv.FormatInt(id, 10))
	}
	msg := fmt.Sprintf("approved %d of %d repairs", len(done), len(ids))
	if len(failed) > 0 {
		msg += "; not approved: " + strings.Join(failed, ", ")
	}
	d.flash(r.Context(), msg)
	http.Redirect(w, r, "/approvals", http.StatusSeeOther)
}

func (d *dashboard) repair(w http.ResponseWriter, r *http.Request) {
	id, ok := repairID(r)
	if !ok {
		d.fail(w, r, http.StatusBadRequest, "invalid repair id", chi.URLParam(r, "id"))
		return
	}
	rd, err := d.cfg.API.RepairDetail(r.Context(), id)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	data := repairStory(rd, d.cfg.API.Catalog())
	self := fmt.Sprintf("/repairs/%d", id)
	d.render(w, r, http.StatusOK, "repair", data, d.live(fmt.Sprintf("Repair %d", id), self, "/api/v1"+self),
		about(id, rd.Repair.Cluster, rd.Repair.Node))
}

func (d *dashboard) node(w http.ResponseWriter, r *http.Request) {
	c, n := chi.URLParam(r, "cluster"), chi.URLParam(r, "node")
	nd, err := d.cfg.API.NodeDetail(r.Context(), c, n)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	self := "/nodes/" + url.PathEscape(c) + "/" + url.PathEscape(n)
	d.render(w, r, http.StatusOK, "node", nodeStory(nd), d.live("Node "+n, self, "/api/v1"+self), about(0, c, n))
}

func (d *dashboard) breakers(w http.ResponseWriter, r *http.Request) {
	b, err := d.cfg.API.Breakers(r.Context())
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "breakers", b, d.live("Breakers", "/breakers", "/api/v1/breakers"))
}

// resume is the breaker's resume button: Service.Resume, the code path of
// POST /api/v1/breakers/resume.
func (d *dashboard) resume(w http.ResponseWriter, r *http.Request) {
	cohort := r.PostFormValue("cohort")
	if _, err := d.cfg.API.Resume(r.Context(), d.caller(r), cohort, r.PostFormValue("reason")); err != nil {
		d.failErr(w, r, err)
		return
	}
	d.flash(r.Context(), "resumed "+cohort+": its held repairs drain at the paced rate")
	http.Redirect(w, r, "/breakers", http.StatusSeeOther)
}

// killSwitch switches every deletion off or on: the first POST asks for
// confirmation, the second (confirm = "on" or "off") calls
// Service.SetKillSwitch, the code path of POST /api/v1/breakers/kill-switch.
func (d *dashboard) killSwitch(w http.ResponseWriter, r *http.Request) {
	on := r.PostFormValue("on") == "true"
	want := map[bool]string{true: "on", false: "off"}[on]
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if r.PostFormValue("confirm") != want {
		if reason == "" {
			d.fail(w, r, http.StatusBadRequest, "invalid request", "reason: required")
			return
		}
		d.render(w, r, http.StatusOK, "killswitch", map[string]any{"KillSwitch": want, "On": on, "Reason": reason},
			func(p *page) { p.Title = "Kill switch " + want + "?" })
		return
	}
	if _, err := d.cfg.API.SetKillSwitch(r.Context(), d.caller(r), on, reason); err != nil {
		d.failErr(w, r, err)
		return
	}
	d.flash(r.Context(), "kill switch "+want)
	http.Redirect(w, r, "/breakers", http.StatusSeeOther)
}

func (d *dashboard) reasons(w http.ResponseWriter, r *http.Request) {
	d.render(w, r, http.StatusOK, "reasons", d.cfg.API.Catalog(), func(p *page) { p.Title, p.JSON = "Reasons", "/api/v1/reasons" })
}

// historyData is the history page: GET /api/v1/stats and the same value as
// JSON for the chart.
type historyData struct {
	api.Stats
	JSON template.JS
}

func (d *dashboard) history(w http.ResponseWriter, r *http.Request) {
	st, err := d.cfg.API.Stats(r.Context(), 30)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	b, err := json.Marshal(st)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "history", historyData{Stats: st, JSON: template.JS(b)}, func(p *page) {
		p.Title, p.JSON = "Charts", "/api/v1/stats?days=30"
	})
}

// shadowData is the shadow page: the report's cost limits, the range asked
// for (as typed: a duration before now or an RFC 3339 time), and the report
// (GET /api/v1/shadow's value) or why there is none.
type shadowData struct {
	Limits       api.ShadowLimits
	Since, Until string
	From, To     time.Time
	Report       *shadow.Report
	Error        string
	Asked        bool
}

// shadowPage is the report an SRE reads before turning repair on:
// Service.Shadow, the code path of GET /api/v1/shadow, for the range of
// the form (default: the last week, computed only when asked).
func (d *dashboard) shadowPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	data := shadowData{Limits: d.cfg.API.ShadowLimits(), Since: strings.TrimSpace(q.Get("since")), Until: strings.TrimSpace(q.Get("until"))}
	opts := func(p *page) { p.Title, p.JSON = "Shadow report", "/api/v1/shadow" }
	if data.Since == "" {
		data.Since = "168h"
		d.render(w, r, http.StatusOK, "shadow", data, opts)
		return
	}
	data.Asked = true
	now := d.cfg.Now().UTC()
	status := http.StatusOK
	from, err := shadow.RangeTime(data.Since, now)
	to := now
	if err == nil && data.Until != "" {
		to, err = shadow.RangeTime(data.Until, now)
	}
	if err != nil {
		data.Error, status = err.Error(), http.StatusBadRequest
		d.render(w, r, status, "shadow", data, opts)
		return
	}
	data.From, data.To = from.UTC(), to.UTC()
	rep, err := d.cfg.API.Shadow(r.Context(), d.caller(r), from, to)
	if err != nil {
		status = api.StatusOf(err)
		if status == http.StatusInternalServerError {
			d.failErr(w, r, err)
			return
		}
		data.Error = err.Error()
		d.render(w, r, status, "shadow", data, opts)
		return
	}
	sr, ok := rep.(*shadow.Report)
	if !ok {
		d.fail(w, r, http.StatusInternalServerError, "unexpected shadow report", fmt.Sprintf("%T", rep))
		return
	}
	data.Report = sr
	d.render(w, r, http.StatusOK, "shadow", data, func(p *page) {
		opts(p)
		p.JSON = "/api/v1/shadow?" + url.Values{"since": {from.UTC().Format(time.RFC3339)}, "until": {to.UTC().Format(time.RFC3339)}}.Encode()
	})
}
