package finding_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

const dirty = "a\x00b\x1b[2Jc\rd\x7fe"

// fill sets every string reachable from v (struct fields, slice elements,
// map keys and values, pointees) to dirty, growing empty slices and maps to
// one element and allocating nil pointers.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(dirty)
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(v.Elem())
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		}
		for i := range v.Len() {
			fill(v.Index(i))
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	}
}

// controls lists the paths of strings reachable from v that still hold a
// control byte other than tab and newline.
func controls(v reflect.Value, path string, out *[]string) {
	switch v.Kind() {
	case reflect.String:
		if strings.ContainsFunc(v.String(), func(r rune) bool { return (r < 0x20 && r != '\t' && r != '\n') || r == 0x7f }) {
			*out = append(*out, path)
		}
	case reflect.Pointer:
		if !v.IsNil() {
			controls(v.Elem(), path, out)
		}
	case reflect.Slice:
		for i := range v.Len() {
			controls(v.Index(i), path+"[]", out)
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			controls(k, path+"{key}", out)
			controls(v.MapIndex(k), path+"{value}", out)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				controls(v.Field(i), path+"."+f.Name, out)
			}
		}
	}
}

// TestSanitizeCoversEveryString: Sanitize escapes NUL and the other control
// bytes in every string field of a Report, so a field added later without
// it fails here, not as a 400 that makes the agent drop a batch (NUL) or as
// an escape sequence on an operator's terminal.
func TestSanitizeCoversEveryString(t *testing.T) {
	var r finding.Report
	fill(reflect.ValueOf(&r).Elem())
	r.Sanitize()
	var left []string
	controls(reflect.ValueOf(r), "report", &left)
	if len(left) > 0 {
		t.Fatalf("control bytes left after Sanitize in %v", left)
	}
	if want := `a\x00b\x1b[2Jc\x0dd\x7fe`; r.Node != want || r.Heartbeat.Image != want {
		t.Fatalf("escaped as %q / %q, want %q", r.Node, r.Heartbeat.Image, want)
	}
	for k, v := range r.Findings[0].Attrs {
		if k != `a\x00b\x1b[2Jc\x0dd\x7fe` || v != k {
			t.Fatalf("attrs escaped as %q=%q", k, v)
		}
	}
}

// TestSanitizeKeepsText: tabs, newlines and non-ASCII text are not
// escaped, and a clean string is returned unchanged.
func TestSanitizeKeepsText(t *testing.T) {
	r := finding.Report{Node: "n1", Findings: []finding.Finding{{Evidence: []string{"NVRM: Xid\t79\nnext line — ünïcode"}}}}
	r.Sanitize()
	if got := r.Findings[0].Evidence[0]; got != "NVRM: Xid\t79\nnext line — ünïcode" {
		t.Fatalf("evidence changed to %q", got)
	}
}
