// Package dcgmtext turns DCGM-side text into findings: the result tables of
// "dcgmi diag" (ParseDiag, in dcgmi's table layout and in the collapsed
// one-line rendering found in blog posts), dcgm-exporter samples in the
// Prometheus text format (ParseMetrics) and health events that a GPU health
// monitor logged as JSON (ParseHealthEvents).
//
// These are saved outputs of other tools, read by `fleetrepair-agent scan`
// and by tests. The live agent talks to DCGM itself (agent/source/dcgm).
// Findings carry no node or ID; detect.Stamp completes them.
package dcgmtext
