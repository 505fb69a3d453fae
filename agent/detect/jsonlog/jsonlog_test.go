package jsonlog

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		in       string
		want     any
		complete bool
	}{
		{"object", `{"a":"b","n":12,"t":true,"z":null,"l":[1,"x"]}`,
			map[string]any{"a": "b", "n": Number("12"), "t": true, "z": nil, "l": []any{Number("1"), "x"}}, true},
		{"cut in a string", `{"a":"b","msg":"hello wor`, map[string]any{"a": "b", "msg": "hello wor"}, false},
		{"cut after a key", `{"a":"b","msg"`, map[string]any{"a": "b"}, false},
		{"cut in nested", `{"a":{"b":[1,2`, map[string]any{"a": map[string]any{"b": []any{Number("1"), Number("2")}}}, false},
		{"escapes", `"q\"\\\/\n\u00e9\ud83d\ude00"`, "q\"\\/\né😀", true},
		{"raw newline in string", "\"a\nb\"", "a\nb", true},
		{"garbage", `xyz`, nil, false},
		{"empty", ``, nil, false},
		{"cut escape", `"ab\`, "ab", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, complete := Parse(tt.in)
			if !reflect.DeepEqual(got, tt.want) || complete != tt.complete {
				t.Errorf("Parse(%q) = %#v, %v; want %#v, %v", tt.in, got, complete, tt.want, tt.complete)
			}
		})
	}
}

func TestRecordsJoinsWrappedLines(t *testing.T) {
	t.Parallel()
	in := "preamble\n{\"a\":\"x\\\"y\",\"b\":\"revisi\non\"}\n\n{\"c\":1}\n"
	got, err := Records(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"preamble", `{"a":"x\"y","b":"revision"}`, `{"c":1}`}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Records = %q, want %q", got, want)
	}
}

func TestWalkVisitsSerialisedDocuments(t *testing.T) {
	t.Parallel()
	v, _ := Parse(`{"annotations":{"ev":"[{\"checkName\":\"X\",\"nested\":{\"k\":1}}]"}}`)
	var names []string
	Walk(v, func(m map[string]any) {
		if s, ok := String(m, "checkName"); ok {
			names = append(names, s)
		}
	})
	if !reflect.DeepEqual(names, []string{"X"}) {
		t.Errorf("Walk found %q", names)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":"c"}]}`, `{"a":"\u12`, `[[[[`, `"\ud83d\u"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, _ := Parse(s)
		Walk(v, func(map[string]any) {})
	})
}
