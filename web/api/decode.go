package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// MaxCommandBytes is the largest body of an on-call command (approve,
// reject, breakers resume, kill-switch): 64 KiB, far above any reason.
const MaxCommandBytes = 64 << 10

// errTrailingData is what decodeStrict returns for a body that holds more
// than one JSON value ({"reason": "x"}garbage, {"a": 1}}).
var errTrailingData = errors.New("trailing data after the JSON object")

// decodeStrict decodes the one JSON value of r's body into v: at most limit
// bytes, no unknown field, nothing after the value but white space. It is
// the one decoder of every JSON request body of the API, so a malformed
// body is refused the same way on every route.
//
// Errors: *http.MaxBytesError when the body is over limit (the caller
// answers 413), errTrailingData, or the json package's syntax, type and
// unknown-field errors (400).
func decodeStrict(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	var extra json.RawMessage
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
		return nil
	case errors.As(err, new(*http.MaxBytesError)):
		return err
	default:
		return errTrailingData
	}
}

// tooLarge reports whether err is decodeStrict's over-limit error, and the
// limit.
func tooLarge(err error) (int64, bool) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return tooBig.Limit, true
	}
	return 0, false
}
