package load

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// WriteTable writes the run's figures as plain-text tables: one row per
// phase, then the wave's outcome and the loss count.
func (r *Result) WriteTable(w io.Writer) error {
	c := r.Config
	var b strings.Builder
	clusters := "1 cluster"
	if c.Clusters > 1 {
		clusters = fmt.Sprintf("%d clusters (%s: %d Nodes with NodeClaims; %d others: %d Nodes, Nodes only, kube-apiserver GOGC %d, at niceness %d)",
			c.Clusters, Cluster, c.FirstClusterNodes, c.Clusters-1, c.Nodes-c.FirstClusterNodes, c.SmallAPIServerGOGC, c.SmallAPIServerNice)
	}
	fmt.Fprintf(&b, "fleetrepair load: %d nodes in %d zones, %s, %d controller replica(s) (--workers %d, --toleration %s, --resync %s), heartbeat %s, background %.0f findings/s\n",
		c.Nodes, c.Zones, clusters, c.Replicas, c.Workers, c.Toleration, c.Resync, c.Heartbeat, c.Background)
	pool := fmt.Sprintf("the controller's default, %d connections (store.DefaultMaxConns)", store.DefaultMaxConns)
	if c.DBPoolConns > 0 {
		pool = fmt.Sprintf("pool_max_conns=%d", c.DBPoolConns)
	}
	fmt.Fprintf(&b, "controller database pool: %s; agents: agent/uplink, --agent-auth=static\n", pool)
	fmt.Fprintf(&b, "setup (PostgreSQL, API server, Nodes+NodeClaims, controllers, first heartbeats): %s\n\n", r.Setup.Round(time.Second))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	writePhaseHeader(tw)
	for _, p := range r.Phases {
		writePhaseRow(tw, p)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString(phaseLegend)
	fmt.Fprintln(&b)
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "apiserver requests in %s (harness excluded): %s\n", p.Name, verbs(p.APIByVerb))
	}
	fmt.Fprintln(&b)
	if r.FirstAPIServerRSS > 0 {
		fmt.Fprintf(&b, "kube-apiserver RSS after setup: %s %.0f MiB", Cluster, float64(r.FirstAPIServerRSS)/(1<<20))
		if r.SmallAPIServerRSS > 0 {
			fmt.Fprintf(&b, ", largest of the other clusters %.0f MiB", float64(r.SmallAPIServerRSS)/(1<<20))
		}
		fmt.Fprintln(&b)
	}
	if c.Clusters > 1 {
		fmt.Fprintf(&b, "fleet scenario: steady heartbeats of every node in every cluster, then the drain (no wave, kill or outage)\n")
		fmt.Fprintf(&b, "findings: %d given to agents, %d acknowledged, %d of those stored, lost %d (must be 0)\n", r.Enqueued, r.Acked, r.Stored, r.Lost)
		return r.writeVerdict(w, &b)
	}
	fmt.Fprintf(&b, "wave: %d nodes of %s report Xid 79 within %s\n", r.WaveNodes, "zone-a", c.WaveSpread)
	if r.WaveCohort != "" {
		fmt.Fprintf(&b, "  breaker %s tripped %s after the first failing report, %s\n",
			r.WaveCohort, r.TripAfter.Round(time.Millisecond), relativeTo(r.TripLast, "the last one was acknowledged"))
	} else {
		fmt.Fprintf(&b, "  no breaker tripped\n")
	}
	fmt.Fprintf(&b, "  wave repairs opened: %d of %d; finding given to the agent -> repair created p50 %s p99 %s\n",
		r.WaveOpened, r.WaveNodes, r.OpenP50.Round(time.Millisecond), r.OpenP99.Round(time.Millisecond))
	fmt.Fprintf(&b, "  repairs opened over time (s:count): %s\n", samples(r.OpenedAt))
	fmt.Fprintf(&b, "  NodeClaims deleted in the wave zone: %d (must be 0)\n", r.ZoneDeleted)
	if r.LoneAfter > 0 {
		fmt.Fprintf(&b, "  lone failure elsewhere: deleting %s after its report (toleration %s); NodeClaim DELETE calls: %.0f\n",
			r.LoneAfter.Round(time.Millisecond), c.Toleration, r.LoneDeletes)
	} else {
		fmt.Fprintf(&b, "  lone failure elsewhere: never reached deleting; NodeClaim DELETE calls: %.0f\n", r.LoneDeletes)
	}
	if r.Killed != "" {
		fmt.Fprintf(&b, "  %s (the Lease holder) SIGKILLed mid-wave\n", r.Killed)
	}
	fmt.Fprintf(&b, "findings: %d given to agents, %d acknowledged, %d of those stored, lost %d (must be 0)\n", r.Enqueued, r.Acked, r.Stored, r.Lost)
	return r.writeVerdict(w, &b)
}

// writeVerdict ends the table with the notes and the correctness verdict
// and writes it all to w.
func (r *Result) writeVerdict(w io.Writer, b *strings.Builder) error {
	for _, n := range r.Notes {
		fmt.Fprintf(b, "note: %s\n", n)
	}
	if len(r.Failures) == 0 {
		fmt.Fprintf(b, "correctness: ok\n")
	} else {
		fmt.Fprintf(b, "correctness: %d FAILURES\n", len(r.Failures))
		for _, f := range r.Failures {
			fmt.Fprintf(b, "  - %s\n", f)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writePhaseHeader and writePhaseRow are the phase table's header and one
// phase's row (tab-separated, for a tabwriter).
func writePhaseHeader(w io.Writer) {
	fmt.Fprintln(w, "phase\tseconds\taccepted/s\tp50 ms\tp99 ms\t429\t5xx\t4xx\tno answer\tno conn\tctrl cores\tctrl RSS MiB\tpg cores\tharness cores\tharness RSS MiB\tapiserver req/s\tload avg start/end\t")
}

func writePhaseRow(w io.Writer, p Phase) {
	fmt.Fprintf(w, "%s\t%.0f\t%.1f\t%.1f\t%.1f\t%d\t%d\t%d\t%d\t%d\t%.2f\t%.0f\t%.2f\t%.2f\t%.0f\t%.1f\t%.1f/%.1f\t\n", p.Name, p.Duration.Seconds(), p.Rate(),
		ms(p.P50), ms(p.P99), p.TooMany, p.ServerErrors, p.ClientErrors, p.NetworkErrors, p.NoConn, p.ControllerCores,
		float64(p.ControllerRSS)/(1<<20), p.PostgresCores, p.HarnessCores, float64(p.HarnessRSS)/(1<<20), p.APIRate(), p.LoadStart, p.LoadEnd)
}

// phaseLegend explains the phase table's less obvious columns, once, below it.
const phaseLegend = `accepted/s, p50, p99: reports answered 2xx per second and their latency, as the agents saw it.
429, 5xx, 4xx: reports answered so (429: the controller's backpressure, retried by the agent after Retry-After).
no answer: POSTs that got no HTTP answer (connection refused or reset, timeout), e.g. the killed replica's agents until they move to the other one.
no conn: those of no answer that spent most of their time without a connection: waiting in the harness's own bound (4,096 connections per replica) or connecting.
ctrl cores: CPU of every controller replica together, in cores (CPU seconds / wall seconds); ctrl RSS: the largest RSS of one replica, sampled every second.
pg cores: the postmaster and every backend; harness cores, RSS: this process (agents, API polling), which shares the CPUs.
apiserver req/s: apiserver_request_total of every API server, the harness's own requests taken out.
load avg start/end: the machine's 1-minute load average (/proc/loadavg) when the phase started and ended.
`

// relativeTo says d relative to an event: "1.2s after the event", or
// "2.604s before the event" when d is negative.
func relativeTo(d time.Duration, event string) string {
	d = d.Round(time.Millisecond)
	if d < 0 {
		return fmt.Sprintf("%s before %s", -d, event)
	}
	return fmt.Sprintf("%s after %s", d, event)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func verbs(m map[string]float64) string {
	type kv struct {
		k string
		v float64
	}
	var l []kv
	for k, v := range m {
		l = append(l, kv{k, v})
	}
	for i := 1; i < len(l); i++ {
		for j := i; j > 0 && l[j].v > l[j-1].v; j-- {
			l[j], l[j-1] = l[j-1], l[j]
		}
	}
	var parts []string
	for i, e := range l {
		if i == 8 {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.0f", strings.TrimSpace(e.k), e.v))
	}
	return strings.Join(parts, ", ")
}

func samples(s []Sample) string {
	var parts []string
	step := max(1, len(s)/15)
	for i := 0; i < len(s); i += step {
		parts = append(parts, fmt.Sprintf("%.1f:%d", s[i].At.Seconds(), s[i].N))
	}
	if len(s) > 0 && (len(s)-1)%step != 0 {
		last := s[len(s)-1]
		parts = append(parts, fmt.Sprintf("%.1f:%d", last.At.Seconds(), last.N))
	}
	return strings.Join(parts, " ")
}
