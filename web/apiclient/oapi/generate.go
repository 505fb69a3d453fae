// Package oapi is the HTTP client of the controller's API generated from
// web/api/openapi.yaml by oapi-codegen (client.gen.go; `make generate`).
// Callers use web/apiclient, which wraps it.
package oapi

//go:generate go tool oapi-codegen -config oapi-codegen.yaml -o client.gen.go ../../api/openapi.yaml
