package load

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	rpprof "runtime/pprof"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// progress writes lines to Config.Progress as they happen (a benchmark's
// b.Logf is held until it returns, so a run stopped midway would leave
// nothing); safe for concurrent use, a no-op without a writer.
type progress struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *progress) printf(format string, args ...any) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, time.Now().UTC().Format("15:04:05")+" "+format+"\n", args...)
}

// phaseRow writes phase p as its own small table (the header and one row),
// the columns of Result.WriteTable.
func (p *progress) phaseRow(ph Phase) {
	if p == nil || p.w == nil {
		return
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	writePhaseHeader(tw)
	writePhaseRow(tw, ph)
	_ = tw.Flush()
	p.printf("phase %s done:\n%s", ph.Name, strings.TrimRight(b.String(), "\n"))
}

// selfSample is the harness process's own memory at one moment.
type selfSample struct {
	rss        int64 // /proc/self, bytes
	heap       uint64
	goroutines int
}

func sampleSelf() selfSample {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, _ := rssBytes(os.Getpid())
	return selfSample{rss: rss, heap: ms.HeapAlloc, goroutines: runtime.NumGoroutine()}
}

// watchSelf samples the harness's own RSS every second (the phases' largest,
// Phase.HarnessRSS), prints RSS, live heap and goroutines every
// cfg.SelfEvery, and writes a heap profile every cfg.HeapProfileEvery into
// cfg.HeapProfileDir (harness-heap-HHMMSS.pb.gz; compare two with `go tool
// pprof -base`), until ctx ends.
func (h *harness) watchSelf(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastPrint, lastHeap := time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if v, err := rssBytes(os.Getpid()); err == nil && v > h.selfRSS.Load() {
				h.selfRSS.Store(v)
			}
			if h.cfg.SelfEvery > 0 && now.Sub(lastPrint) >= h.cfg.SelfEvery {
				lastPrint = now
				s := sampleSelf()
				h.prog.printf("harness: RSS %.0f MiB, heap %.0f MiB, %d goroutines, agents: %d of %d started, %d had a report accepted, outcomes %+v",
					float64(s.rss)/(1<<20), float64(s.heap)/(1<<20), s.goroutines, h.started.Load(), h.agents.Load(), h.st.firstOK.Load(), h.st.counts())
			}
			if h.cfg.HeapProfileDir != "" && h.cfg.HeapProfileEvery > 0 && now.Sub(lastHeap) >= h.cfg.HeapProfileEvery {
				lastHeap = now
				if path, err := writeHeapProfile(h.cfg.HeapProfileDir, now); err != nil {
					h.prog.printf("harness heap profile: %v", err)
				} else {
					h.prog.printf("harness heap profile: %s", path)
				}
			}
		}
	}
}

// writeHeapProfile writes the process's heap profile (after a GC, so it
// shows live memory) into dir, named for now, and returns its path.
func writeHeapProfile(dir string, now time.Time) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create profile folder: %w", err)
	}
	path := filepath.Join(dir, "harness-heap-"+now.UTC().Format("150405")+".pb.gz")
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("create heap profile: %w", err)
	}
	runtime.GC()
	if err := rpprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return "", fmt.Errorf("write heap profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write heap profile: %w", err)
	}
	return path, nil
}
