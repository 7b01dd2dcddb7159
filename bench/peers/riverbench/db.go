package riverbench

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotEmpty is returned by CheckEmpty when River's job table already holds
// jobs, which would skew a run.
var ErrNotEmpty = errors.New("river_job is not empty")

// CreateDatabase creates the database name on the server that cfg reaches,
// through cfg's own database, dropping any database of that name first. The
// name should belong to the benchmark alone.
func CreateDatabase(ctx context.Context, cfg *pgx.ConnConfig, name string) error {
	if err := DropDatabase(ctx, cfg, name); err != nil {
		return err
	}
	return admin(ctx, cfg, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize(), name)
}

// DropDatabase drops the database name, if it exists, ending the sessions
// still connected to it (PostgreSQL 13 or later).
func DropDatabase(ctx context.Context, cfg *pgx.ConnConfig, name string) error {
	return admin(ctx, cfg, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)", name)
}

func admin(ctx context.Context, cfg *pgx.ConnConfig, stmt, name string) error {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to database %q: %w", cfg.Database, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, stmt); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return fmt.Errorf("database %q: %w (this needs the CREATEDB privilege; "+
				"or point --database-url at a database dedicated to this benchmark and pass --dedicated)", name, err)
		}
		return fmt.Errorf("database %q: %w", name, err)
	}
	return nil
}

// CheckEmpty returns ErrNotEmpty when River's job table holds any job. Run
// it after Migrate.
func CheckEmpty(ctx context.Context, pool *pgxpool.Pool) error {
	var n int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&n); err != nil {
		return fmt.Errorf("count River's jobs: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: it holds %d jobs from an earlier run (empty it, or let riverbench use a throwaway database)", ErrNotEmpty, n)
	}
	return nil
}
