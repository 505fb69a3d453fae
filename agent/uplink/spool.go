package uplink

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Spool file layout: one JSON header line, then one finding per line, in
// enqueue order.
const (
	spoolFileName = "findings.jsonl"
	spoolFormat   = "fleetrepair.dev/uplink-spool/v1"
)

// spoolHeader is the first line of the spool file.
type spoolHeader struct {
	Format  string    `json:"format"`
	Node    string    `json:"node"`
	SavedAt time.Time `json:"savedAt"`
}

// spool is the on-disk copy of the findings the uplink could not deliver
// yet: a snapshot of the batch in flight and the queue, replaced atomically
// (write, fsync, rename) as a whole. It is written only while the controller
// is unreachable and at shutdown, so a healthy agent does no disk I/O for it.
type spool struct {
	dir      string
	maxBytes int64
	node     string

	onDisk  bool   // a spool file exists
	version uint64 // queue version of the last save
}

func (s *spool) path() string { return filepath.Join(s.dir, spoolFileName) }

// load reads the spool file, if any. Lines that do not parse are skipped and
// counted; a file of another format is an error (and is left alone).
func (s *spool) load() (out []finding.Finding, skipped int, err error) {
	f, err := os.Open(s.path())
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("open spool: %w", err)
	}
	defer f.Close()
	s.onDisk = true
	r := bufio.NewReader(io.LimitReader(f, s.maxBytes+64<<10))
	line, err := r.ReadBytes('\n')
	var h spoolHeader
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, 0, fmt.Errorf("read spool: %w", err)
	}
	if jerr := json.Unmarshal(line, &h); jerr != nil || h.Format != spoolFormat {
		return nil, 0, fmt.Errorf("read spool %s: not a %s file", s.path(), spoolFormat)
	}
	for err == nil {
		line, err = r.ReadBytes('\n')
		if len(line) == 0 {
			continue
		}
		var fd finding.Finding
		if json.Unmarshal(line, &fd) != nil {
			skipped++ // a torn or corrupted line: keep the rest
			continue
		}
		out = append(out, fd)
	}
	if !errors.Is(err, io.EOF) {
		return out, skipped, fmt.Errorf("read spool: %w", err)
	}
	return out, skipped, nil
}

// save replaces the spool file with fs, or removes it when fs is empty. When
// the findings do not fit in maxBytes, the oldest non-critical ones, then the
// oldest critical ones, are left out; it returns how many.
func (s *spool) save(fs []finding.Finding, critical func(finding.Finding) bool, now time.Time) (omitted int, err error) {
	if len(fs) == 0 {
		if err := os.Remove(s.path()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("remove spool: %w", err)
		}
		s.onDisk = false
		return 0, nil
	}
	header, err := json.Marshal(spoolHeader{Format: spoolFormat, Node: s.node, SavedAt: now.UTC()})
	if err != nil {
		return 0, fmt.Errorf("encode spool header: %w", err)
	}
	lines := make([][]byte, len(fs))
	total := int64(len(header) + 1)
	for i, f := range fs {
		if lines[i], err = json.Marshal(f); err != nil {
			return 0, fmt.Errorf("encode spooled finding: %w", err)
		}
		total += int64(len(lines[i]) + 1)
	}
	for _, wantCritical := range []bool{false, true} {
		for i := 0; i < len(fs) && total > s.maxBytes; i++ {
			if lines[i] != nil && critical(fs[i]) == wantCritical {
				total -= int64(len(lines[i]) + 1)
				lines[i] = nil
				omitted++
			}
		}
	}
	if err := writeFileAtomic(s.path(), func(w io.Writer) error {
		bw := bufio.NewWriter(w)
		bw.Write(header)
		bw.WriteByte('\n')
		for _, l := range lines {
			if l != nil {
				bw.Write(l)
				bw.WriteByte('\n')
			}
		}
		return bw.Flush()
	}); err != nil {
		return 0, err
	}
	s.onDisk = true
	return omitted, nil
}

// writeFileAtomic writes path through a temporary file in the same
// directory, fsynced and renamed over path, then fsyncs the directory: after
// a crash path holds either the old or the new content, never a mix.
func writeFileAtomic(path string, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*.tmp")
	if err != nil {
		return fmt.Errorf("create spool file: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return fmt.Errorf("write spool file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("sync spool file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close spool file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename spool file: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // best effort: the rename is already visible to this boot
		d.Close()
	}
	return nil
}

// removeStaleTemps deletes temporary files a crash mid-save left behind, so
// the spool directory stays bounded.
func (s *spool) removeStaleTemps() {
	matches, _ := filepath.Glob(filepath.Join(s.dir, "."+spoolFileName+"-*.tmp"))
	for _, m := range matches {
		os.Remove(m)
	}
}
