// Package jsonlog reads JSON log lines as published in bug reports and
// forums, which are often not valid JSON any more: cut off in the middle of a
// value, wrapped onto several physical lines, or carrying JSON documents
// inside string values (annotations holding a serialised health event).
//
// Parse never fails: it returns what it could read and says whether the
// value was complete. Detectors built on it must therefore only rely on keys
// that appear before the cut.
package jsonlog

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxRecord bounds one JSON record (after joining wrapped lines), so that a
// file without line structure cannot exhaust memory.
const MaxRecord = 1 << 20

// Records splits a JSON-lines log into records. A physical line that does not
// start with '{' (after spaces) continues the record before it and is joined
// to it without a separator, which undoes the wrapping found in published
// logs. Lines before the first '{' are returned as records of their own.
func Records(r io.Reader) ([]string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), MaxRecord)
	var out []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	for sc.Scan() {
		line := sc.Text()
		t := strings.TrimSpace(line)
		if t == "" {
			continue
		}
		if strings.HasPrefix(t, "{") || cur.Len() == 0 {
			flush()
			cur.WriteString(strings.TrimLeft(line, " \t"))
			continue
		}
		if cur.Len()+len(line) > MaxRecord {
			flush()
		}
		cur.WriteString(line)
	}
	flush()
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read json log: %w", err)
	}
	return out, nil
}

// Parse reads one JSON value from s. Objects become map[string]any, arrays
// []any, numbers json-style strings kept in a Number, strings string, and
// true/false/null bool and nil. Where s ends (or breaks) inside a value, the
// value read so far is returned (an object with the keys before the cut, a
// string up to the cut) with complete false. Raw control characters inside
// strings are accepted as they are.
func Parse(s string) (v any, complete bool) {
	p := parser{s: s}
	v = p.value(0)
	return v, !p.broken
}

// Number is a JSON number as written.
type Number string

// Int returns the number as an int, or false.
func (n Number) Int() (int, bool) {
	i, err := strconv.Atoi(string(n))
	return i, err == nil
}

// maxDepth bounds nesting, so a hostile line cannot exhaust the stack.
const maxDepth = 64

type parser struct {
	s      string
	i      int
	broken bool
}

func (p *parser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) any {
	p.ws()
	if p.i >= len(p.s) || depth > maxDepth {
		p.broken = true
		return nil
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.str()
	case c == 't', c == 'f', c == 'n':
		for _, lit := range []struct {
			w string
			v any
		}{{"true", true}, {"false", false}, {"null", nil}} {
			if strings.HasPrefix(p.s[p.i:], lit.w) {
				p.i += len(lit.w)
				return lit.v
			}
		}
		p.broken = true
		p.i = len(p.s)
		return nil
	default:
		j := p.i
		for j < len(p.s) && strings.IndexByte("+-0123456789.eE", p.s[j]) >= 0 {
			j++
		}
		if j == p.i {
			p.broken = true
			p.i = len(p.s)
			return nil
		}
		n := Number(p.s[p.i:j])
		p.i = j
		return n
	}
}

func (p *parser) object(depth int) map[string]any {
	m := map[string]any{}
	p.i++ // '{'
	for {
		p.ws()
		if p.i >= len(p.s) {
			p.broken = true
			return m
		}
		if p.s[p.i] == '}' {
			p.i++
			return m
		}
		if p.s[p.i] == ',' {
			p.i++
			continue
		}
		if p.s[p.i] != '"' {
			p.broken = true
			p.i = len(p.s)
			return m
		}
		k := p.str()
		if p.broken {
			return m
		}
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			p.broken = true
			p.i = len(p.s)
			return m
		}
		p.i++
		v := p.value(depth + 1)
		m[k] = v
		if p.broken {
			return m
		}
	}
}

func (p *parser) array(depth int) []any {
	a := []any{}
	p.i++ // '['
	for {
		p.ws()
		if p.i >= len(p.s) {
			p.broken = true
			return a
		}
		switch p.s[p.i] {
		case ']':
			p.i++
			return a
		case ',':
			p.i++
			continue
		}
		v := p.value(depth + 1)
		a = append(a, v)
		if p.broken {
			return a
		}
	}
}

// str reads a string starting at the opening quote.
func (p *parser) str() string {
	p.i++ // '"'
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String()
		case c == '\\':
			if p.i+1 >= len(p.s) {
				p.i = len(p.s)
				p.broken = true
				return b.String()
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'u':
				if p.i+4 > len(p.s) {
					p.i = len(p.s)
					p.broken = true
					return b.String()
				}
				r, err := strconv.ParseUint(p.s[p.i:p.i+4], 16, 32)
				p.i += 4
				if err != nil {
					b.WriteRune(utf8.RuneError)
					continue
				}
				if utf16.IsSurrogate(rune(r)) && p.i+6 <= len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
					if r2, err := strconv.ParseUint(p.s[p.i+2:p.i+6], 16, 32); err == nil {
						p.i += 6
						b.WriteRune(utf16.DecodeRune(rune(r), rune(r2)))
						continue
					}
				}
				b.WriteRune(rune(r))
			default: // '"', '\\', '/', and anything else taken literally
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
			p.i++
		}
	}
	p.broken = true
	return b.String()
}

// String returns m[key] when it is a string.
func String(m map[string]any, key string) (string, bool) {
	s, ok := m[key].(string)
	return s, ok
}

// Walk calls fn for every object in v, depth first, and for every string that
// itself holds a JSON object or array (parsed leniently), so that documents
// serialised into annotations or messages are visited too.
func Walk(v any, fn func(m map[string]any)) {
	walk(v, fn, 0)
}

func walk(v any, fn func(m map[string]any), depth int) {
	if depth > maxDepth {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		fn(v)
		for _, e := range v {
			walk(e, fn, depth+1)
		}
	case []any:
		for _, e := range v {
			walk(e, fn, depth+1)
		}
	case string:
		t := strings.TrimSpace(v)
		if strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
			inner, _ := Parse(t)
			walk(inner, fn, depth+1)
		}
	}
}
