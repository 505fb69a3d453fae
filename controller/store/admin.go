package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CreateDatabase creates database name on the server dsn connects to, as a
// copy of database template when template is not empty (nobody may be
// connected to the template meanwhile). For test harnesses and the demo; the
// controller never creates databases.
func CreateDatabase(ctx context.Context, dsn, name, template string) error {
	q := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		q += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if err := adminExec(ctx, dsn, q); err != nil {
		return errorf(err, "create database %s", name)
	}
	return nil
}

// DropDatabase drops database name on the server dsn connects to,
// disconnecting its sessions first; a database that does not exist is not an
// error. For test harnesses and the demo.
func DropDatabase(ctx context.Context, dsn, name string) error {
	q := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
	if err := adminExec(ctx, dsn, q); err != nil {
		return errorf(err, "drop database %s", name)
	}
	return nil
}

func adminExec(ctx context.Context, dsn, q string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, q)
	return err
}
