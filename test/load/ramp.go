package load

import "time"

// agentStartInterval is the default pace of the agents' start: one agent
// every 3 ms, 10,000 agents per 30 s heartbeat, the most the harness has
// started at once with every agent accepted within its first heartbeat
// (the 10,000-node runs of docs/scale.md). A real fleet's agents start
// with their nodes, over minutes to hours; 100,000 agents starting within
// one heartbeat is a thundering herd no fleet sends (docs/scale.md, "The
// harness at 100,000 agents (session 7)").
const agentStartInterval = 3 * time.Millisecond

// defaultAgentRamp is Config.AgentRamp's default for nodes agents
// heartbeating every heartbeat: one heartbeat interval (as every run before
// the ramp: 1,000- and 10,000-node runs are unchanged), or nodes x
// agentStartInterval when longer (20,000 nodes: 60 s; 100,000: 5 min).
func defaultAgentRamp(nodes int, heartbeat time.Duration) time.Duration {
	return max(heartbeat, time.Duration(nodes)*agentStartInterval)
}

// rampDelay is when agent i of n starts, from the first agent's start:
// evenly over ramp, i*ramp/n (0 for the first, ramp*(n-1)/n for the last).
// n <= 0 or i outside [0, n) is clamped to that range.
func rampDelay(i, n int, ramp time.Duration) time.Duration {
	if n <= 1 || i <= 0 || ramp <= 0 {
		return 0
	}
	i = min(i, n-1)
	return time.Duration(float64(ramp) * float64(i) / float64(n))
}
