package api

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDecodeStrict: one JSON value, no unknown field, nothing after it, at
// most the limit; white space after the value is fine.
func TestDecodeStrict(t *testing.T) {
	type body struct {
		Reason string `json:"reason"`
	}
	for _, tc := range []struct {
		name, in string
		ok       bool
		tooLarge bool
		trailing bool
	}{
		{name: "one object", in: `{"reason":"x"}`, ok: true},
		{name: "trailing white space", in: "{\"reason\":\"x\"}\n \t\n", ok: true},
		{name: "trailing garbage", in: `{"reason":"x"}garbage`, trailing: true},
		{name: "second object", in: `{"reason":"x"} {"reason":"y"}`, trailing: true},
		{name: "stray closing brace", in: `{"reason":"x"}}`, trailing: true},
		{name: "stray closing bracket", in: `{"reason":"x"}]`, trailing: true},
		{name: "unknown field", in: `{"reason":"x","extra":1}`},
		{name: "wrong type", in: `{"reason":5}`},
		{name: "empty", in: ``},
		{name: "over the limit", in: `{"reason":"` + strings.Repeat("x", 100) + `"}`, tooLarge: true},
		{name: "over the limit in the trailing data", in: `{"reason":"x"}` + strings.Repeat(" ", 60) + `{"reason":"` + strings.Repeat("y", 40) + `"}`, tooLarge: true},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.in))
		var v body
		err := decodeStrict(httptest.NewRecorder(), r, 64, &v)
		_, big := tooLarge(err)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.ok:
			if v.Reason != "x" {
				t.Errorf("%s: reason %q, want x", tc.name, v.Reason)
			}
		case err == nil:
			t.Errorf("%s: accepted, want an error", tc.name)
		case big != tc.tooLarge:
			t.Errorf("%s: %v: too large = %v, want %v", tc.name, err, big, tc.tooLarge)
		case errors.Is(err, errTrailingData) != tc.trailing:
			t.Errorf("%s: %v: trailing = %v, want %v", tc.name, err, !tc.trailing, tc.trailing)
		}
	}
}
