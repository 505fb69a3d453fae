package dcgmtext

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// MaxDiagInput bounds what ParseDiag reads: a dcgmi diag table is a few KiB.
const MaxDiagInput = 4 << 20

// DiagRow is one test row of a dcgmi diag table, continuation rows joined:
// Results holds one entry per result line ("Pass - GPUs: 1, 2", "Fail - GPU: 0").
type DiagRow struct {
	Section string // "Deployment", "Hardware", ...
	Name    string // "Diagnostic", "Warning", ...
	Cells   []string
}

var (
	// separator matches the table's rule lines, with or without a section
	// title: "+----+----+", "+====+====+", "|-----  Metadata  ---+----|".
	separator = regexp.MustCompile(`[|+][-=]{2,}(?:\s*([A-Za-z][A-Za-z /]*?)\s*[-=]+)?\+[-=]+[|+]`)
	// result is one result line: "Pass", "Fail - GPU: 0", "Pass - GPUs: 1, 2, 3", "Pass - All".
	result = regexp.MustCompile(`^(Pass|Fail|Warn|Skip)(?:\s*-\s*(?:All|GPUs?:\s*([0-9,\s]+)))?\s*$`)
	// faultyMemory is the memory test's warning.
	faultyMemory = regexp.MustCompile(`GPU (\d+) Found (\d+) faulty memory elements`)
)

// ParseDiagRows reads a dcgmi diag table into rows. Both renderings work:
// dcgmi's own layout, and the same text with every run of whitespace
// collapsed onto one line, because rows are found by counting cell borders
// (three per row of the two-column table) rather than by lines. Cell text
// wrapped over continuation rows is joined without a separator, since dcgmi
// wraps at a fixed width, mid-word ("o" + "n GPU 0"). A row cut off before
// its result cell (truncated output) is dropped.
func ParseDiagRows(r io.Reader) ([]DiagRow, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxDiagInput))
	if err != nil {
		return nil, fmt.Errorf("read dcgmi diag output: %w", err)
	}
	text := string(data)
	// Replace rule lines by a marker carrying the section title.
	var b strings.Builder
	last := 0
	for _, m := range separator.FindAllStringSubmatchIndex(text, -1) {
		b.WriteString(text[last:m[0]])
		b.WriteString("\x00")
		if m[2] >= 0 {
			b.WriteString(strings.TrimSpace(text[m[2]:m[3]]))
		}
		b.WriteString("\x00")
		last = m[1]
	}
	b.WriteString(text[last:])
	text = b.String()

	var rows []DiagRow
	section := ""
	var cells []string // cells of the row being read
	inRow := false
	var cell strings.Builder
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c == 0 { // section marker
			j := strings.IndexByte(text[i+1:], 0)
			if j < 0 {
				break
			}
			if t := text[i+1 : i+1+j]; t != "" {
				section = t
			}
			i += j + 1
			inRow, cells = false, nil
			cell.Reset()
			continue
		}
		if c != '|' {
			if inRow {
				cell.WriteByte(c)
			}
			continue
		}
		if !inRow {
			inRow, cells = true, nil
			cell.Reset()
			continue
		}
		cells = append(cells, strings.TrimSpace(cell.String()))
		cell.Reset()
		if len(cells) == 2 {
			inRow = false
			if cells[0] == "" && len(rows) > 0 { // continuation of the row above
				prev := &rows[len(rows)-1]
				prev.Cells = append(prev.Cells, cells[1])
				continue
			}
			rows = append(rows, DiagRow{Section: section, Name: cells[0], Cells: []string{cells[1]}})
		}
	}
	return rows, nil
}

// Text joins a row's wrapped cells into the text dcgmi wrapped.
func (r DiagRow) Text() string { return strings.Join(r.Cells, "") }

// ParseDiag reads dcgmi diag output and returns one dcgm-diag finding per
// result line of every test that did not pass on all GPUs: a failed test on
// GPU 0 gives a "fail" finding for GPU 0, and a "pass" finding listing the
// GPUs it passed on, so the controller can tell which GPUs were tested and
// found healthy. Tests that passed everywhere, were skipped, or whose result
// was cut off yield nothing. The "Found N faulty memory elements" warning is
// attached (faulty_memory_elements) to the failed finding of its GPU.
func ParseDiag(r io.Reader) ([]finding.Finding, error) {
	rows, err := ParseDiagRows(r)
	if err != nil {
		return nil, err
	}
	faulty := map[string]string{} // GPU index -> elements
	var warnings []string
	for _, row := range rows {
		if row.Name == "Warning" {
			t := row.Text()
			warnings = append(warnings, t)
			for _, m := range faultyMemory.FindAllStringSubmatch(t, -1) {
				faulty[m[1]] = m[2]
			}
		}
	}
	var out []finding.Finding
	for _, row := range rows {
		if row.Name == "Warning" || row.Name == "Info" || row.Section == "Metadata" {
			continue
		}
		type res struct{ result, gpus, line string }
		var results []res
		allPass := true
		for _, c := range row.Cells {
			m := result.FindStringSubmatch(c)
			if m == nil {
				continue
			}
			r := res{result: strings.ToLower(m[1]), gpus: gpuList(m[2]), line: c}
			results = append(results, r)
			if r.result != "pass" && r.result != "skip" {
				allPass = false
			}
		}
		if allPass {
			continue
		}
		for _, r := range results {
			if r.result == "skip" {
				continue
			}
			attrs := map[string]string{finding.AttrTest: row.Name, finding.AttrResult: r.result}
			if r.gpus != "" {
				attrs[finding.AttrGPUIndex] = r.gpus
			}
			if r.result != "pass" && !strings.Contains(r.gpus, ",") {
				if n, ok := faulty[r.gpus]; ok {
					attrs[finding.AttrFaultyMemory] = n
				}
				for _, w := range warnings {
					if r.gpus != "" && strings.HasPrefix(w, "GPU "+r.gpus+" ") {
						attrs[finding.AttrMessage] = w
					}
				}
			}
			out = append(out, finding.Finding{Detector: finding.DetectorDCGMDiag, Attrs: attrs,
				Evidence: []string{"| " + row.Name + " | " + r.line + " |"}})
		}
	}
	return out, nil
}

// gpuList normalises "1, 2, 3" to "1,2,3".
func gpuList(s string) string {
	var ids []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		if _, err := strconv.Atoi(f); err == nil {
			ids = append(ids, f)
		}
	}
	return strings.Join(ids, ",")
}
