{{/* fleetrepair.alertGroups is the PrometheusRule's groups: every alert has a
runbook in docs/runbooks/<alert>.md. The controller's state gauges
(web/api/gauges.go) are exported by every replica from PostgreSQL, so the
rules take max over replicas; counters are summed. test/kubeapi's
TestAlertRules checks them with promtool check rules and test rules. */}}
{{- define "fleetrepair.alertGroups" -}}
{{- $ns := printf "namespace=%q" .Release.Namespace -}}
{{- $r := .Values.prometheusRule -}}
{{- $url := trimSuffix "/" $r.runbookBaseURL -}}
groups:
  {{- if .Values.controller.enabled }}
  - name: fleetrepair-controller
    rules:
      - alert: FleetRepairControllerDown
        expr: absent(up{ {{- $ns }}, service="{{ include "fleetrepair.controller.name" . }}"} == 1)
        for: 5m
        labels: {severity: critical}
        annotations:
          summary: 'No fleetrepair controller replica is up; broken GPU nodes are neither quarantined nor replaced.'
          runbook_url: {{ $url }}/FleetRepairControllerDown.md
      - alert: FleetRepairMetricsStoreDown
        expr: max(fleetrepair_metrics_store_up{ {{- $ns }}}) == 0
        for: 5m
        labels: {severity: critical}
        annotations:
          summary: 'The controller cannot read PostgreSQL; repairs stall and the repair, breaker and agent alerts are blind.'
          runbook_url: {{ $url }}/FleetRepairMetricsStoreDown.md
      - alert: FleetRepairRepairsHeldByBreaker
        expr: max by (cluster) (fleetrepair_repairs{ {{- $ns }}, state="awaiting_approval", held_by="breaker"}) > 0
        for: {{ $r.heldForMinutes }}m
        labels: {severity: critical}
        annotations:
          summary: '{{ "{{ $value }}" }} repairs in cluster {{ "{{ $labels.cluster }}" }} have been held behind a breaker for more than {{ $r.heldForMinutes }} minutes; their nodes stay quarantined.'
          runbook_url: {{ $url }}/FleetRepairRepairsHeldByBreaker.md
      - alert: FleetRepairRepairsAwaitingApproval
        expr: max by (cluster) (fleetrepair_repairs{ {{- $ns }}, state="awaiting_approval", held_by="action"}) > 0
        for: {{ $r.heldForMinutes }}m
        labels: {severity: warning}
        annotations:
          summary: '{{ "{{ $value }}" }} repairs in cluster {{ "{{ $labels.cluster }}" }} have waited more than {{ $r.heldForMinutes }} minutes for an approver (their action is not executable without one).'
          runbook_url: {{ $url }}/FleetRepairRepairsAwaitingApproval.md
      - alert: FleetRepairBreakerOpen
        expr: max by (cohort) (fleetrepair_breaker_open{ {{- $ns }}}) == 1
        for: {{ $r.breakerOpenForMinutes }}m
        labels: {severity: critical}
        annotations:
          summary: 'The fleetrepair breaker of cohort {{ "{{ $labels.cohort }}" }} is open; no node of the cohort is replaced until a human resumes it.'
          runbook_url: {{ $url }}/FleetRepairBreakerOpen.md
      - alert: FleetRepairKillSwitchOn
        expr: max(fleetrepair_kill_switch{ {{- $ns }}}) == 1
        for: 1m
        labels: {severity: warning}
        annotations:
          summary: 'The fleetrepair kill switch is on; no repair anywhere deletes a NodeClaim.'
          runbook_url: {{ $url }}/FleetRepairKillSwitchOn.md
      - alert: FleetRepairClusterAgentsSilent
        expr: max by (cluster) (fleetrepair_agents_reporting{ {{- $ns }}}) == 0 and max by (cluster) (fleetrepair_agents_silent{ {{- $ns }}}) > 0
        for: 10m
        labels: {severity: critical}
        annotations:
          summary: 'No fleetrepair agent of cluster {{ "{{ $labels.cluster }}" }} has reported for 10 minutes; its GPU faults go unseen.'
          runbook_url: {{ $url }}/FleetRepairAgentsSilent.md
      - alert: FleetRepairAgentsSilent
        expr: |-
          max by (cluster) (fleetrepair_agents_silent{ {{- $ns }}})
            / (max by (cluster) (fleetrepair_agents_silent{ {{- $ns }}}) + max by (cluster) (fleetrepair_agents_reporting{ {{- $ns }}}))
            > {{ $r.agentsSilentRatio | float64 }}
        for: 15m
        labels: {severity: warning}
        annotations:
          summary: '{{ "{{ $value | humanizePercentage }}" }} of the fleetrepair agents of cluster {{ "{{ $labels.cluster }}" }} stopped reporting.'
          runbook_url: {{ $url }}/FleetRepairAgentsSilent.md
      - alert: FleetRepairReplacementsFailing
        expr: sum(increase(fleetrepair_replacements_failed_total{ {{- $ns }}}[1h])) > 0
        labels: {severity: warning}
        annotations:
          summary: '{{ `{{ $value | printf "%.0f" }}` }} NodeClaim replacements did not become Ready and healthy within the verify timeout in the last hour.'
          runbook_url: {{ $url }}/FleetRepairReplacementsFailing.md
      - alert: FleetRepairNodeClaimsStuck
        expr: max by (cluster, state) (fleetrepair_nodeclaims{ {{- $ns }}, state=~"stuck-terminating|not-registered|no-node|not-initialized"}) > 0
        for: 30m
        labels: {severity: warning}
        annotations:
          summary: '{{ `{{ $value | printf "%.0f" }}` }} NodeClaims of cluster {{ "{{ $labels.cluster }}" }} are {{ "{{ $labels.state }}" }} past their grace; the Karpenter lifecycle is stuck (not a health fault: fleetrepair repairs nothing and deletes nothing for it).'
          runbook_url: {{ $url }}/FleetRepairNodeClaimsStuck.md
      - alert: FleetRepairDeletionBudgetExhausted
        expr: max by (cluster, nodepool, budget) (fleetrepair_deletion_budget_remaining{ {{- $ns }}, budget=~"deletions_per_hour|nodepool_deletions_per_hour"}) == 0
        for: 5m
        labels: {severity: warning}
        annotations:
          summary: 'fleetrepair has spent the {{ "{{ $labels.budget }}" }} deletion budget of cluster {{ "{{ $labels.cluster }}" }}{{ `{{ with $labels.nodepool }}, NodePool {{ . }}{{ end }}` }}; further repairs wait (held, not lost).'
          runbook_url: {{ $url }}/FleetRepairDeletionBudgetExhausted.md
      - alert: FleetRepairNoLeader
        expr: sum by (cluster) (fleetrepair_cluster_leader{ {{- $ns }}}) == 0
        for: 5m
        labels: {severity: critical}
        annotations:
          summary: 'No fleetrepair controller replica leads cluster {{ "{{ $labels.cluster }}" }}; its broken nodes are neither quarantined nor replaced.'
          runbook_url: {{ $url }}/FleetRepairNoLeader.md
      - alert: FleetRepairIngestErrors
        expr: sum(rate(fleetrepair_ingest_reports_total{ {{- $ns }}, result="error"}[10m])) > 0
        for: 10m
        labels: {severity: warning}
        annotations:
          summary: 'The controller fails to store agent reports ({{ `{{ $value | printf "%.2g" }}` }}/s); agents retry and spool, findings arrive late.'
          runbook_url: {{ $url }}/FleetRepairIngestErrors.md
      - alert: FleetRepairIngestSlow
        expr: histogram_quantile(0.99, sum by (le) (rate(fleetrepair_http_request_duration_seconds_bucket{ {{- $ns }}, route="/api/v1/reports"}[10m]))) > 0.1
        for: 15m
        labels: {severity: warning}
        annotations:
          summary: 'The controller answers agent reports slowly: p99 {{ `{{ $value | printf "%.2g" }}` }} s over 10 minutes, the goal is 0.1 s; next come 429 and 503, and findings arrive late.'
          runbook_url: {{ $url }}/FleetRepairIngestSlow.md
      - alert: FleetRepairAgentsUnauthorized
        expr: sum(rate(fleetrepair_ingest_reports_total{ {{- $ns }}, result="unauthorized"}[10m])) > 0
        for: 15m
        labels: {severity: warning}
        annotations:
          summary: 'The controller refuses agent reports as unauthorized ({{ `{{ $value | printf "%.2g" }}` }}/s); those nodes are unmonitored.'
          runbook_url: {{ $url }}/FleetRepairIngestErrors.md
      - alert: FleetRepairReconcileErrors
        expr: sum(rate(fleetrepair_reconcile_total{ {{- $ns }}, result="error"}[10m])) > 0.1
        for: 15m
        labels: {severity: warning}
        annotations:
          summary: 'fleetrepair node reconciliations keep failing (API server, database or permissions).'
          runbook_url: {{ $url }}/FleetRepairReconcileErrors.md
  {{- end }}
  {{- if .Values.agent.enabled }}
  - name: fleetrepair-agent
    rules:
      - alert: FleetRepairAgentDroppingFindings
        expr: sum by (pod) (increase(fleetrepair_agent_uplink_dropped_total{ {{- $ns }}}[15m])) > 0
        labels: {severity: warning}
        annotations:
          summary: 'The fleetrepair agent in {{ "{{ $labels.pod }}" }} dropped findings it could not send; faults on its node may go unrepaired.'
          runbook_url: {{ $url }}/FleetRepairAgentDroppingFindings.md
  {{- end }}
{{- end -}}
