package breaker

import (
	"fmt"
	"sort"
	"strings"
)

// Cohort names a group of nodes that share one attribute value, for example
// zone=us-east-1a or driver_version=610.57.04.
type Cohort struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// String returns the cohort as "key=value", the form used in State, Decision
// and the API.
func (c Cohort) String() string { return c.Key + "=" + c.Value }

// ParseCohort parses "key=value". The value may contain '=' characters; the
// key may not be empty.
func ParseCohort(s string) (Cohort, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return Cohort{}, fmt.Errorf("parse cohort %q: want key=value", s)
	}
	return Cohort{Key: k, Value: v}, nil
}

// Node is one node's cohort attributes: cluster, nodepool, zone,
// instance_type, image, kernel, driver_version, monitoring_image and any
// configured label (rack, nvlink_domain). Keys the Policy does not use are
// ignored; a missing or empty value puts the node in no cohort of that key.
type Node struct {
	Name  string
	Attrs map[string]string
}

// Fleet is an index of the nodes' cohort memberships, built once by
// Policy.Fleet and reused by every Evaluate until node metadata changes (a
// node joins or leaves, a rollout changes an attribute). Building it is
// O(nodes x keys) map work; evaluating against it is proportional to the
// failure signals and the cohorts they touch, which keeps Evaluate cheap for
// a fleet of 100,000 nodes. A Fleet is immutable and safe for concurrent use.
type Fleet struct {
	keyRank map[string]int // precedence rank of each key (lower = more specific cause)
	cohorts []Cohort
	rank    []int              // cohort id -> key rank
	size    []int32            // cohort id -> member count
	ids     []map[string]int32 // per key rank: value -> cohort id
	names   []string
	pos     map[string]int32
	// member[i*stride : (i+1)*stride] are node i's cohort ids, -1 for none.
	member []int32
	stride int
	// Members of cohort c are memberNodes[memberStart[c]:memberStart[c+1]].
	memberStart []int32
	memberNodes []int32
}

// Len returns the number of nodes in the fleet.
func (f *Fleet) Len() int { return len(f.names) }

// CohortSize returns the number of nodes in the cohort, 0 when none.
func (f *Fleet) CohortSize(c Cohort) int {
	if id, ok := f.id(c); ok {
		return int(f.size[id])
	}
	return 0
}

// id returns the cohort's id in this fleet.
func (f *Fleet) id(c Cohort) (int32, bool) {
	r, ok := f.keyRank[c.Key]
	if !ok {
		return 0, false
	}
	id, ok := f.ids[r][c.Value]
	return id, ok
}

// Cohorts returns every cohort of the fleet, sorted by key precedence then
// value.
func (f *Fleet) Cohorts() []Cohort {
	out := append([]Cohort(nil), f.cohorts...)
	sort.Slice(out, func(i, j int) bool {
		ri, rj := f.keyRank[out[i].Key], f.keyRank[out[j].Key]
		if ri != rj {
			return ri < rj
		}
		return out[i].Value < out[j].Value
	})
	return out
}

// Fleet indexes nodes for Evaluate. Duplicate node names keep the first entry.
func (p *Policy) Fleet(nodes []Node) *Fleet {
	keys := p.cfg.Keys()
	f := &Fleet{
		keyRank: make(map[string]int, len(keys)),
		ids:     make([]map[string]int32, len(keys)),
		pos:     make(map[string]int32, len(nodes)),
		stride:  len(keys),
	}
	for i, k := range keys {
		f.keyRank[k] = i
		f.ids[i] = map[string]int32{}
	}
	f.names = make([]string, 0, len(nodes))
	f.member = make([]int32, 0, len(nodes)*len(keys))
	for _, n := range nodes {
		if _, dup := f.pos[n.Name]; dup {
			continue
		}
		f.pos[n.Name] = int32(len(f.names))
		f.names = append(f.names, n.Name)
		for ki, k := range keys {
			v := n.Attrs[k]
			if v == "" {
				f.member = append(f.member, -1)
				continue
			}
			id, ok := f.ids[ki][v]
			if !ok {
				id = int32(len(f.cohorts))
				f.ids[ki][v] = id
				f.cohorts = append(f.cohorts, Cohort{Key: k, Value: v})
				f.rank = append(f.rank, ki)
				f.size = append(f.size, 0)
			}
			f.size[id]++
			f.member = append(f.member, id)
		}
	}
	// Member lists (CSR layout): one pass to size, one to fill.
	f.memberStart = make([]int32, len(f.cohorts)+1)
	for c, s := range f.size {
		f.memberStart[c+1] = f.memberStart[c] + s
	}
	f.memberNodes = make([]int32, f.memberStart[len(f.cohorts)])
	fill := append([]int32(nil), f.memberStart[:len(f.cohorts)]...)
	for i := range f.names {
		for _, c := range f.nodeCohorts(int32(i)) {
			if c >= 0 {
				f.memberNodes[fill[c]] = int32(i)
				fill[c]++
			}
		}
	}
	return f
}

func (f *Fleet) nodeCohorts(i int32) []int32 {
	return f.member[int(i)*f.stride : (int(i)+1)*f.stride]
}

func (f *Fleet) members(c int32) []int32 {
	return f.memberNodes[f.memberStart[c]:f.memberStart[c+1]]
}
