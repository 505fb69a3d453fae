// Package migrations holds the PostgreSQL schema of the controller as
// numbered goose migrations (NNNNN_name.sql, each with -- +goose Up and
// -- +goose Down sections), embedded so the binary carries its schema.
// controller/store applies them (store.Migrate); nothing else reads them.
//
// Rules: a released migration is never edited, only followed by a new one;
// every migration has a working Down; the store tests run every migration up,
// down to zero and up again on an empty database.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
