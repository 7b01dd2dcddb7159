package queue_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// TestMain gives the examples a migrated database of their own, named by
// PGWORKER_DATABASE_URL as a program would find it; the tests take theirs
// from pgtest.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	server := os.Getenv("TEST_DATABASE_URL")
	if server == "" {
		return m.Run() // the tests say what is missing
	}
	ctx := context.Background()
	b := make([]byte, 6)
	rand.Read(b)
	name := "pgworker_example_" + hex.EncodeToString(b)
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples' database:", err)
		return 1
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		fmt.Fprintln(os.Stderr, "examples' database:", err)
		return 1
	}
	defer conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)") //nolint:errcheck // best effort
	u, err := url.Parse(server)
	if err != nil {
		fmt.Fprintln(os.Stderr, "TEST_DATABASE_URL:", err)
		return 1
	}
	u.Path = "/" + name
	if err := pgtest.MigrateUp(ctx, u.String()); err != nil {
		fmt.Fprintln(os.Stderr, "examples' database:", err)
		return 1
	}
	os.Setenv("PGWORKER_DATABASE_URL", u.String())
	return m.Run()
}
