package breaker

import "math"

// log10FisherUpper returns log10 of the one-sided Fisher exact test p-value
// for over-representation: the probability, when failingTotal failing nodes
// are spread at random over a population of total nodes, that a cohort of
// size members holds failing or more of them (the upper tail of the
// hypergeometric distribution).
//
// The log is returned because the p-values of real incidents are far below
// the smallest float64 (48 failing nodes out of 48 in a fleet of 752 is
// about 1e-80; a zone outage is far smaller still) and the tie-break compares
// them. Arguments outside the support give 0 (p = 1).
func log10FisherUpper(members, failing, total, failingTotal int) float64 {
	n, k, bigN, bigK := float64(members), failing, total, failingTotal
	hi := min(members, failingTotal)
	if members <= 0 || total <= 0 || failing <= 0 || failing > hi || members > total || failingTotal > total {
		return 0
	}
	lo := max(0, members+failingTotal-total)
	if failing <= lo {
		return 0 // every outcome is at least this extreme
	}
	// log P(X = k) = lnC(n, k) + lnC(N-n, K-k) - lnC(N, K)
	logTerm := lnChoose(members, k) + lnChoose(bigN-members, bigK-k) - lnChoose(bigN, bigK)
	// Sum the tail relative to its first term; successive terms follow the
	// ratio P(k+1)/P(k) = (n-k)(K-k) / ((k+1)(N-n-K+k+1)). Past the mode the
	// ratio falls below 1 and keeps falling, so the loop stops early once
	// terms no longer change the sum.
	sum, term := 1.0, 1.0
	for x := k; x < hi; x++ {
		xf := float64(x)
		term *= (n - xf) * (float64(bigK) - xf) / ((xf + 1) * (float64(bigN-members-bigK) + xf + 1))
		sum += term
		if term < sum*1e-17 {
			break
		}
	}
	lp := (logTerm + math.Log(sum)) / math.Ln10
	return min(lp, 0)
}

// lnChoose returns ln(n choose k) through the log-gamma function.
func lnChoose(n, k int) float64 {
	if k < 0 || k > n {
		return math.Inf(-1)
	}
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// jeffreysRate is the posterior mean failure rate of failing out of nodes
// under the Jeffreys prior Beta(1/2, 1/2): (failing + 1/2) / (nodes + 1). It
// is never zero, so a fleet whose other nodes are all healthy has a finite
// rate ratio, and a cohort of a handful of nodes is not credited with a 100%
// rate on one observation.
func jeffreysRate(failing, nodes int) float64 {
	return (float64(failing) + 0.5) / (float64(nodes) + 1)
}
