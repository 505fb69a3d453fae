// Package apiclient is the one HTTP client of the controller's REST API
// (/api/v1) that fleetrepair's command-line client and the demo share: JSON
// in and out, a bearer token, the API's error envelope turned into an error.
package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/web/api"
)

// Timeout bounds one call, connection to decoded body.
const Timeout = 30 * time.Second

// maxBody bounds the response body read (64 MiB).
const maxBody = 64 << 20

// Call sends method to u with body (nil: none; else JSON, sent with
// Content-Type application/json) and token as a bearer token when not
// empty, and decodes a 200 answer's JSON into v. Any other status is an
// error carrying the API's {message, detail, validations} when it sent one;
// the error names the method and URL.
func Call(ctx context.Context, method, u, token string, body []byte, v any) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("read %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e api.ErrorBody
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			msg := e.Message
			if e.Detail != "" {
				msg += ": " + e.Detail
			}
			if len(e.Validations) > 0 {
				msg += ": " + strings.Join(e.Validations, "; ")
			}
			return fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, msg)
		}
		return fmt.Errorf("%s %s: %s", method, u, resp.Status)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", u, err)
	}
	return nil
}
