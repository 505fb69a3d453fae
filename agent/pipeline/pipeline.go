// Package pipeline composes the node agent: a kernel-log source (the live
// /dev/kmsg reader, or a file replayed for demos and tests) feeds the
// detector, whose findings go to the uplink; the heartbeat carries the
// facts the controller needs beyond findings (driver version, monitor
// states, lost kernel records).
//
// `fleetrepair-agent run` and the demo's in-process agents both run it, so
// the demo exercises the same code as a node.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
)

// Source produces kernel records until ctx ends or the input is exhausted.
// It returns nil at the end of a finite input.
type Source interface {
	Run(ctx context.Context, out chan<- kmsg.Record) error
}

// LostCounter is implemented by sources that can tell how many kernel
// records they missed (the live /dev/kmsg reader).
type LostCounter interface {
	Lost() uint64
}

// Replay is a Source that reads a kernel-log file (any format kmsg.ParseText
// knows) once, optionally pacing records by Interval.
type Replay struct {
	Path     string
	Format   kmsg.Format
	Interval time.Duration // pause between records; 0 sends as fast as read
	// Open replaces os.Open (tests, embedded fixtures).
	Open func(path string) (io.ReadCloser, error)
}

// Run implements Source.
func (r Replay) Run(ctx context.Context, out chan<- kmsg.Record) error {
	open := r.Open
	if open == nil {
		open = func(p string) (io.ReadCloser, error) { return os.Open(p) }
	}
	f, err := open(r.Path)
	if err != nil {
		return fmt.Errorf("open replay file: %w", err)
	}
	defer f.Close()
	format := r.Format
	if format == "" {
		format = kmsg.FormatAuto
	}
	p := kmsg.NewTextParser(f, format, kmsg.TextOptions{})
	for {
		rec, ok := p.Next()
		if !ok {
			break
		}
		select {
		case out <- rec:
		case <-ctx.Done():
			return nil
		}
		if r.Interval > 0 {
			select {
			case <-time.After(r.Interval):
			case <-ctx.Done():
				return nil
			}
		}
	}
	if err := p.Err(); err != nil {
		return fmt.Errorf("replay %s: %w", r.Path, err)
	}
	return nil
}

// Config configures an agent pipeline.
type Config struct {
	Source   Source
	Detector detect.Options
	Uplink   *uplink.Uplink
	// ExpireEvery is how often held detector groups are checked (default 1s).
	ExpireEvery time.Duration
	Log         *slog.Logger
	// OnFinding, when set, sees every finding before it is queued (demo output).
	OnFinding func(finding.Finding)
}

// Run reads the source, detects, and sends until ctx ends. A finite source
// (Replay) ending does not stop the agent: it keeps heartbeating, as a node
// whose kernel log went quiet does. It returns the first error of the source
// or the uplink.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Source == nil || cfg.Uplink == nil {
		return errors.New("run agent pipeline: Source and Uplink are required")
	}
	if cfg.ExpireEvery <= 0 {
		cfg.ExpireEvery = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	det := detect.New(cfg.Detector)
	recs := make(chan kmsg.Record, 256)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return cfg.Uplink.Run(ctx) })
	g.Go(func() error {
		defer close(recs)
		return cfg.Source.Run(ctx, recs)
	})

	var mu sync.Mutex
	hb := finding.Heartbeat{Monitors: []finding.MonitorState{{Name: "kernel-log", State: finding.StateOK, Since: time.Now()}}}
	send := func(fs []finding.Finding) {
		for _, f := range fs {
			if f.Detector == finding.DetectorDriverVersion {
				mu.Lock()
				if v := f.Attr(finding.AttrValue); v != "" && v != hb.DriverVersion {
					hb.DriverVersion = v
					cfg.Uplink.SetHeartbeat(hb)
				}
				mu.Unlock()
			}
			if cfg.OnFinding != nil {
				cfg.OnFinding(f)
			}
			cfg.Uplink.Enqueue(f)
		}
	}
	cfg.Uplink.SetHeartbeat(hb)
	g.Go(func() error {
		t := time.NewTicker(cfg.ExpireEvery)
		defer t.Stop()
		open := true
		for {
			select {
			case <-ctx.Done():
				send(det.Flush())
				return nil
			case rec, ok := <-recs:
				if !ok {
					if open {
						send(det.Flush())
						open = false
						recs = nil // a nil channel blocks: keep heartbeating
					}
					continue
				}
				send(det.Feed(rec))
			case <-t.C:
				send(det.Expire(time.Now()))
				if lc, ok := cfg.Source.(LostCounter); ok {
					mu.Lock()
					if n := lc.Lost(); n != hb.LostRecords {
						hb.LostRecords = n
						cfg.Uplink.SetHeartbeat(hb)
					}
					mu.Unlock()
				}
			}
		}
	})
	return g.Wait()
}
