package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrepair/fleetrepair/agent/detect/joblog"
	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// reportJobOptions are the flags of `fleetrepair report-job`.
type reportJobOptions struct {
	cluster                   string
	jobID, jobSource, jobName string
	node                      string   // every failure's reporting node
	hosts                     []string // HOST=NODE: NCCL's host names to Node names
	peers                     []string // ADDRESS=NODE: peer addresses to Node names
	at                        string   // time of failures whose lines carry none (RFC 3339; default now)
	files                     []string
	dryRun                    bool
}

func newReportJobCmd() *cobra.Command {
	o := reportJobOptions{jobSource: finding.JobSourceOther}
	var conn *connection // set below, after cmd exists
	cmd := &cobra.Command{
		Use:   "report-job --cluster C --job-id ID --file FILE...",
		Short: "Send a job's network failures (NCCL NET/IB completion errors) to the controller (needs a reporter token)",
		Long: `report-job reads a job's log (a training job's or pod's output with NCCL's
"NET/IB : Got completion from peer ..." lines), or a ready job report (a JSON
finding.JobReport), and POSTs it to /api/v1/job-reports. Run it from a Slurm
epilog, a Kubeflow hook or a CI job when a job fails.

Each failure names the reporting node, its NIC and the peer. The controller
files an event against both ends (either end, or the switch path between
them, can be at fault), raises a node condition only when the same node fails
with several peers across jobs, and files failures spread over many node
pairs at once as a fabric incident, for the cohort breakers, not the nodes.

NCCL prints the host name (a pod name under Kubernetes): --node names the
Node for every failure (an epilog on that node), --host HOST=NODE maps host
names, else the host name is taken as the Node name. Peers are addresses;
the controller finds the Node holding one (--peer ADDRESS=NODE names it
yourself). Lines without a timestamp are placed at --time (default: now,
the job's end).

The token needs role reporter (a token only for this), approver or admin.
Exit status: 0 sent (or printed with --dry-run), 1 refused or unreachable.`,
		Example: `  fleetrepair report-job --cluster prod --job-id slurm/$SLURM_JOB_ID --job-source slurm \
      --node "$(hostname)" --file "$SLURM_JOB_STDERR" --token "$FLEETREPAIR_TOKEN"
  kubectl logs job-a-worker-0 | fleetrepair report-job --cluster prod --job-id kubeflow/ns/job-a \
      --job-source kubeflow --host job-a-worker-0=gpu-node-17 --file -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := o.build(cmd.InOrStdin(), time.Now())
			if err != nil {
				return err
			}
			if o.dryRun {
				var buf bytes.Buffer
				enc := json.NewEncoder(&buf)
				enc.SetEscapeHTML(false) // NCCL's "peer 10.0.2.36<54862>" stays readable
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return fmt.Errorf("encode job report: %w", err)
				}
				_, err := cmd.OutOrStdout().Write(buf.Bytes())
				return err
			}
			c, t, err := conn.client()
			if err != nil {
				return err
			}
			res, err := c.JobReport(cmd.Context(), rep)
			if err != nil {
				return reachErr(t, err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "job %s: %d failures, %d findings (%d new) on %s\n", rep.Job.ID, res.Failures, res.Findings, res.Inserted, strings.Join(res.Nodes, ", "))
			if len(res.UnresolvedPeers) > 0 {
				fmt.Fprintf(out, "peers no Node holds (only the reporting end filed): %s\n", strings.Join(res.UnresolvedPeers, ", "))
			}
			if len(res.UnknownNodes) > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: no Node of cluster %s is named %s: its findings were filed but reach no node; name the Node with --node NODE or --host HOST=NODE\n",
					rep.Cluster, strings.Join(res.UnknownNodes, ", "))
			}
			if res.FabricIncident {
				fmt.Fprintf(out, "fabric incident: %d node pairs failed at once; filed for the cohort breakers, not against the nodes\n", res.Pairs)
			}
			return nil
		},
	}
	conn = addConnectionFlags(cmd) // --token: an operator token of role reporter, approver or admin
	f := cmd.Flags()
	f.StringVar(&o.cluster, "cluster", "", "the cluster the job ran in (required; for a log input)")
	f.StringVar(&o.jobID, "job-id", "", "the job run's unique ID, e.g. slurm/4242 (required; for a log input)")
	f.StringVar(&o.jobSource, "job-source", o.jobSource, "slurm, kubeflow, ci or other")
	f.StringVar(&o.jobName, "job-name", "", "the job's name (optional)")
	f.StringVar(&o.node, "node", "", "the Node every failure of the log was seen on (default: the host NCCL prints, through --host)")
	f.StringArrayVar(&o.hosts, "host", nil, "HOST=NODE: the Node of a host name NCCL prints (repeatable)")
	f.StringArrayVar(&o.peers, "peer", nil, "ADDRESS=NODE: the Node of a peer address (repeatable; default: the controller resolves it)")
	f.StringVar(&o.at, "time", "", "time of failures whose lines carry none (RFC 3339; default now)")
	f.StringArrayVar(&o.files, "file", nil, `job log or JSON job report ("-": standard input; repeatable)`)
	f.BoolVar(&o.dryRun, "dry-run", false, "print the job report instead of sending it")
	return cmd
}

// build reads the inputs into one job report and validates it at now.
func (o reportJobOptions) build(stdin io.Reader, now time.Time) (finding.JobReport, error) {
	if len(o.files) == 0 {
		return finding.JobReport{}, errors.New("report-job: --file is required (a job log, a JSON job report, or - for standard input)")
	}
	at := now.UTC()
	if o.at != "" {
		t, err := time.Parse(time.RFC3339Nano, o.at)
		if err != nil {
			return finding.JobReport{}, fmt.Errorf("report-job: --time %q is not RFC 3339: %w", o.at, err)
		}
		at = t.UTC()
	}
	hosts, err := pairs("--host", o.hosts)
	if err != nil {
		return finding.JobReport{}, err
	}
	peers, err := pairs("--peer", o.peers)
	if err != nil {
		return finding.JobReport{}, err
	}
	rep := finding.JobReport{SchemaVersion: finding.SchemaVersion, Cluster: o.cluster,
		Job: finding.Job{ID: o.jobID, Source: o.jobSource, Name: o.jobName}}
	fromJSON := false
	for _, name := range o.files {
		data, err := readInput(name, stdin)
		if err != nil {
			return finding.JobReport{}, err
		}
		if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
			if len(o.files) > 1 {
				return finding.JobReport{}, fmt.Errorf("report-job: %s is a JSON job report: give it alone", name)
			}
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&rep); err != nil {
				return finding.JobReport{}, fmt.Errorf("report-job: read job report %s: %w", name, err)
			}
			fromJSON = true
			continue
		}
		fs, _, err := joblog.Parse(bytes.NewReader(data))
		if err != nil {
			return finding.JobReport{}, fmt.Errorf("report-job: %s: %w", name, err)
		}
		for _, f := range fs {
			jf, err := o.failure(f, hosts, peers, at)
			if err != nil {
				return finding.JobReport{}, fmt.Errorf("report-job: %s: %w", name, err)
			}
			rep.Failures = append(rep.Failures, jf)
		}
	}
	if !fromJSON && len(rep.Failures) == 0 {
		return finding.JobReport{}, fmt.Errorf("report-job: no NCCL NET/IB completion error in %s: nothing to report", strings.Join(o.files, ", "))
	}
	if err := rep.Validate(now); err != nil {
		var ve *finding.ValidationError
		if errors.As(err, &ve) {
			return finding.JobReport{}, fmt.Errorf("report-job: the report would be refused:\n  %s", strings.Join(ve.Problems, "\n  "))
		}
		return finding.JobReport{}, err
	}
	return rep, nil
}

// failure turns one nccl-net-error finding of a job log into a failure.
func (o reportJobOptions) failure(f finding.Finding, hosts, peers map[string]string, at time.Time) (finding.JobFailure, error) {
	host := f.Attr(finding.AttrHost)
	node := o.node
	if node == "" {
		node = hosts[host]
	}
	if node == "" {
		node = host
	}
	if finding.CheckName(node) != nil {
		return finding.JobFailure{}, fmt.Errorf("host %q is no Node name: name its Node with --node or --host %s=NODE", host, host)
	}
	jf := finding.JobFailure{Kind: finding.JobFailureNCCLNet, Node: node, NIC: f.Attr(finding.AttrHCA), Time: f.Time, Count: f.Count,
		Peer: finding.JobPeer{Address: f.Attr(finding.AttrPeer), Node: peers[f.Attr(finding.AttrPeer)]}, Evidence: f.Evidence}
	if jf.NIC == "" {
		jf.NIC, _, _ = strings.Cut(f.Attr(finding.AttrLocalGIDs), ",")
	}
	if jf.Time.IsZero() {
		jf.Time = at
	}
	if len(jf.Evidence) > finding.MaxJobEvidence {
		jf.Evidence = jf.Evidence[:finding.MaxJobEvidence]
	}
	for k, dst := range map[string]**int{finding.AttrStatus: &jf.Status, finding.AttrVendorErr: &jf.VendorErr} {
		if v, err := strconv.Atoi(f.Attr(k)); err == nil {
			*dst = &v
		}
	}
	return jf, nil
}

// pairs parses repeated KEY=VALUE flags.
func pairs(flag string, vs []string) (map[string]string, error) {
	out := make(map[string]string, len(vs))
	for _, v := range vs {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" || val == "" {
			return nil, fmt.Errorf("report-job: %s %q: want KEY=NODE", flag, v)
		}
		out[k] = val
	}
	return out, nil
}

// readInput reads a file, or standard input for "-", at most 64 MiB.
func readInput(name string, stdin io.Reader) ([]byte, error) {
	r := stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("report-job: open input: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(bufio.NewReader(r), 64<<20))
	if err != nil {
		return nil, fmt.Errorf("report-job: read %s: %w", name, err)
	}
	return data, nil
}
