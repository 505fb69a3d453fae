package uplink

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// maxErrorBody bounds how much of a controller's error answer is read.
const maxErrorBody = 16 << 10

type outcomeKind int

const (
	outcomeSent     outcomeKind = iota // 2xx
	outcomeRejected                    // malformed batch: drop it
	outcomeRetry                       // try the same batch again later
)

// outcome is the result of one POST.
type outcome struct {
	kind       outcomeKind
	err        error         // why it was not sent (retry and rejected)
	reason     string        // send_errors_total reason (retry)
	retryAfter time.Duration // the controller's Retry-After, 0 when absent
	// validations are the controller's per-field problems of a rejected
	// report ("findings[3].xid: ...", "heartbeat.monitors[0].state: ...").
	validations []string
	// tooLarge: the controller answered 413, the report is over its body
	// limit; the batch is split in halves and each sent on its own.
	tooLarge bool
}

// deliver sends batch until the controller answers it: accepted, or rejected
// as malformed (then dropped and counted). Network errors, 5xx, 408, 429, 401
// and 403 are retried with the same batch after an exponentially growing,
// jittered wait capped at RetryMaxInterval, for as long as it takes. A batch
// answered 413 (over the controller's body limit) is split in halves, sent
// one after the other; only a single finding too large on its own is
// dropped. It returns an error only when ctx ends first, with the findings
// of batch not delivered yet (the in-flight batch of the shutdown).
//
// The backoff schedule comes from backoff.ExponentialBackOff with its own
// randomisation off; the jitter is applied here and the wait is taken on
// Config.Clock, because backoff.Retry waits on a real timer with the
// package-global random source, which tests could not drive.
func (u *Uplink) deliver(ctx context.Context, batch []finding.Finding) ([]finding.Finding, error) {
	return u.deliverPart(ctx, batch, nil)
}

// deliverPart delivers batch, a part of a split batch whose findings later
// are still to be sent after it: the spool keeps them (checkpoint), and is
// not removed when batch is answered.
func (u *Uplink) deliverPart(ctx context.Context, batch, later []finding.Finding) ([]finding.Finding, error) {
	bo := &backoff.ExponentialBackOff{
		InitialInterval: u.cfg.RetryInitialInterval,
		Multiplier:      2,
		MaxInterval:     u.cfg.RetryMaxInterval,
	}
	bo.Reset()
	skipHeartbeat := false
	for attempt := 1; ; attempt++ {
		hb, hbVersion := u.heartbeat()
		if skipHeartbeat {
			hb = nil
		}
		res := u.post(ctx, u.report(batch, hb))
		if res.kind == outcomeRejected && res.tooLarge && len(batch) > 1 {
			first, second := splitHalves(batch)
			u.log.Warn("controller refused a report as too large, sending it in halves", "findings", len(batch), "err", res.err)
			if rest, err := u.deliverPart(ctx, first, append(slices.Clone(second), later...)); err != nil {
				return append(rest, second...), err
			}
			return u.deliverPart(ctx, second, later)
		}
		if res.kind == outcomeRejected {
			// One bad item must not cost the batch: drop only what the
			// controller named and send the rest at once.
			if rest, noHB, ok := u.splitRejected(res, batch, hb != nil); ok {
				batch, skipHeartbeat = rest, skipHeartbeat || noHB
				if noHB {
					u.heartbeatAnswered(hbVersion) // resending it would not help
				}
				continue
			}
		}
		if res.kind != outcomeRetry {
			u.answered(res, batch, hbVersion, len(later) > 0)
			if u.failing {
				u.failing = false
				u.log.Info("controller reachable again", "attempts", attempt,
					"outage", u.cfg.Clock.Now().Sub(u.failingSince).Round(time.Millisecond))
			}
			return nil, nil
		}
		if ctx.Err() != nil {
			return batch, ctx.Err()
		}
		u.m.sendErrors.WithLabelValues(res.reason).Inc()
		u.checkpoint(append(slices.Clone(batch), later...))
		wait := u.retryWait(bo.NextBackOff(), res.retryAfter)
		if !u.failing {
			u.failing, u.failingSince = true, u.cfg.Clock.Now()
			u.log.Warn("send report failed, retrying with backoff until the controller answers",
				"err", res.err, "findings", len(batch), "wait", wait)
		} else {
			u.log.Debug("send report failed", "err", res.err, "attempt", attempt, "wait", wait)
		}
		u.m.retries.Inc()
		t := u.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return batch, ctx.Err()
		case <-t.C():
		}
	}
}

// splitHalves splits a batch of at least two findings in two (the first
// half the smaller when odd), each its own slice.
func splitHalves(batch []finding.Finding) (first, second []finding.Finding) {
	h := len(batch) / 2
	return slices.Clone(batch[:h]), slices.Clone(batch[h:])
}

// splitRejected reads a 400's validations: when every problem names a
// finding of batch ("findings[i]...") or the heartbeat ("heartbeat..."), it
// counts the named findings as dropped (rejected) and returns the rest, and
// whether to send without the heartbeat; ok is false when a problem concerns
// the whole report (or nothing would change), and the batch is then dropped
// as before. A controller of another version may refuse what this agent's
// own validation let through; this keeps its good findings flowing.
func (u *Uplink) splitRejected(res outcome, batch []finding.Finding, withHeartbeat bool) (rest []finding.Finding, noHeartbeat, ok bool) {
	if len(res.validations) == 0 {
		return nil, false, false
	}
	bad := map[int]bool{}
	for _, v := range res.validations {
		switch {
		case strings.HasPrefix(v, "heartbeat"):
			noHeartbeat = true
		case strings.HasPrefix(v, "findings["):
			end := strings.IndexByte(v, ']')
			i, err := strconv.Atoi(v[len("findings["):max(end, len("findings["))])
			if end < 0 || err != nil || i < 0 || i >= len(batch) {
				return nil, false, false
			}
			bad[i] = true
		default:
			return nil, false, false
		}
	}
	if noHeartbeat && !withHeartbeat || len(bad) == 0 && !noHeartbeat {
		return nil, false, false
	}
	rest = make([]finding.Finding, 0, len(batch)-len(bad))
	for i, f := range batch {
		if !bad[i] {
			rest = append(rest, f)
		}
	}
	if len(bad) > 0 {
		u.m.dropped.WithLabelValues(DropRejected).Add(float64(len(bad)))
		u.log.Error("controller rejected findings of a report, dropping them and sending the rest", "err", res.err,
			"dropped", len(bad), "kept", len(rest))
	}
	if noHeartbeat {
		u.log.Error("controller rejected the heartbeat, sending the findings without it", "err", res.err)
	}
	return rest, noHeartbeat, true
}

// retryWait applies "equal jitter" to the backoff interval d, giving a wait in
// [d/2, d): never longer than the schedule, never so short that a fleet of
// agents retries in step. A longer Retry-After from the controller wins: the
// wait is then in [Retry-After, 1.25 x Retry-After), so that the agents an
// overloaded or recovering controller turned away do not all come back in
// the same second; always at most RetryMaxInterval.
func (u *Uplink) retryWait(d, retryAfter time.Duration) time.Duration {
	d = min(d, u.cfg.RetryMaxInterval)
	wait := d/2 + time.Duration(u.cfg.Rand()*float64(d/2))
	if retryAfter > wait {
		wait = min(retryAfter+time.Duration(u.cfg.Rand()*float64(retryAfter/4)), u.cfg.RetryMaxInterval)
	}
	return max(wait, time.Millisecond)
}

// answered does the bookkeeping of a report the controller answered. more
// is true when batch is a part of a split batch whose other parts are not
// delivered yet: the spool still holds them and stays.
func (u *Uplink) answered(res outcome, batch []finding.Finding, hbVersion uint64, more bool) {
	now := u.cfg.Clock.Now()
	u.lastExchange = now
	if res.kind == outcomeRejected {
		u.m.rejected.Inc()
		u.m.dropped.WithLabelValues(DropRejected).Add(float64(len(batch)))
		u.log.Error("controller rejected report, dropping its findings", "err", res.err, "findings", len(batch))
	} else {
		u.m.sentReports.Inc()
		u.m.sentFindings.Add(float64(len(batch)))
		u.m.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
	}
	u.heartbeatAnswered(hbVersion)
	if u.q.state().n == 0 && !more {
		if u.overflow.CompareAndSwap(true, false) {
			u.log.Info("uplink queue drained after dropping findings")
		}
		if u.spool != nil && u.spool.onDisk { // everything answered: remove the file
			if _, err := u.saveSpool(nil, 0); err != nil {
				u.log.Error("remove delivered spool", "err", err) // resent after a restart: duplicates, not loss
			}
		}
	}
}

// report builds the envelope for batch.
func (u *Uplink) report(batch []finding.Finding, hb *finding.Heartbeat) *finding.Report {
	if batch == nil {
		batch = []finding.Finding{} // "findings": [], not null
	}
	return &finding.Report{
		SchemaVersion: finding.SchemaVersion,
		Cluster:       u.cfg.Cluster,
		Node:          u.cfg.Node,
		BootID:        u.cfg.BootID,
		AgentVersion:  u.cfg.AgentVersion,
		SentAt:        u.cfg.Clock.Now().UTC(),
		Findings:      batch,
		Heartbeat:     hb,
	}
}

// post makes one attempt to deliver r and classifies the answer.
func (u *Uplink) post(ctx context.Context, r *finding.Report) outcome {
	body, err := json.Marshal(r)
	if err != nil { // cannot happen with the finding types; never retry it
		return outcome{kind: outcomeRejected, err: fmt.Errorf("encode report: %w", err)}
	}
	token, err := u.token()
	if err != nil {
		return outcome{kind: outcomeRetry, reason: errToken, err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, u.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.endpoint, bytes.NewReader(body))
	if err != nil {
		return outcome{kind: outcomeRetry, reason: errNetwork, err: fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "fleetrepair-agent/"+u.cfg.AgentVersion)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := u.cfg.HTTPClient.Do(req)
	if err != nil {
		return outcome{kind: outcomeRetry, reason: errNetwork, err: fmt.Errorf("post report: %w", err)}
	}
	defer func() {
		// Drain a little so the connection can be reused, then close.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
	}()

	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return outcome{kind: outcomeSent}
	}
	msg, validations := errorMessage(resp.Body)
	err = fmt.Errorf("post report: controller answered %s: %s", resp.Status, msg)
	switch {
	case code >= 500:
		return outcome{kind: outcomeRetry, reason: err5xx, err: err, retryAfter: retryAfter(resp.Header, u.cfg.Clock.Now())}
	case code == http.StatusTooManyRequests:
		return outcome{kind: outcomeRetry, reason: err429, err: err, retryAfter: retryAfter(resp.Header, u.cfg.Clock.Now())}
	case code == http.StatusRequestTimeout:
		return outcome{kind: outcomeRetry, reason: err408, err: err}
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return outcome{kind: outcomeRetry, reason: errAuth, err: err}
	case code >= 400:
		return outcome{kind: outcomeRejected, err: err, validations: validations, tooLarge: code == http.StatusRequestEntityTooLarge}
	default:
		return outcome{kind: outcomeRetry, reason: errOther, err: err}
	}
}

func (u *Uplink) token() (string, error) {
	if u.cfg.TokenFile == "" {
		return u.cfg.Token, nil
	}
	b, err := os.ReadFile(u.cfg.TokenFile)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// errorMessage reads the controller's error envelope {message, detail,
// validations} and renders it on one line, also returning the validations;
// any other body is quoted, cut to a few hundred bytes.
func errorMessage(body io.Reader) (string, []string) {
	b, _ := io.ReadAll(io.LimitReader(body, maxErrorBody))
	var env struct {
		Message     string          `json:"message"`
		Detail      string          `json:"detail"`
		Validations json.RawMessage `json:"validations"`
	}
	if json.Unmarshal(b, &env) == nil && env.Message != "" {
		s := env.Message
		if env.Detail != "" {
			s += ": " + env.Detail
		}
		var list []string
		if v := bytes.TrimSpace(env.Validations); len(v) > 0 && !bytes.Equal(v, []byte("null")) {
			s += " validations=" + string(v)
			_ = json.Unmarshal(v, &list) // the controller's are strings; anything else names no item
		}
		return s, list
	}
	const maxQuoted = 512
	if len(b) > maxQuoted {
		b = b[:maxQuoted]
	}
	return strconv.Quote(string(bytes.TrimSpace(b))), nil
}

// retryAfter parses a Retry-After header (delay-seconds or HTTP date); 0 when
// absent or unreadable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
