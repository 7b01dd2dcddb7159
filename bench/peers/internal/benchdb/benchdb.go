// Package benchdb gives each test its own database on the PostgreSQL server
// named by TEST_DATABASE_URL, dropped when the test ends.
//
//	url := benchdb.New(t) // a URL to a fresh, empty database
package benchdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/bench/peers/riverbench"
)

// ServerURL returns TEST_DATABASE_URL, failing the test when it is not set.
func ServerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("TEST_DATABASE_URL")
	if u == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL server (13 or later) " +
			"where this user may create databases, as a postgres:// URL")
	}
	return u
}

// New creates an empty database named after a random suffix and returns a
// URL to it. The database is dropped when the test ends.
func New(t testing.TB) string {
	t.Helper()
	server := ServerURL(t)
	cfg, err := pgx.ParseConfig(server)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL: %v", err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "riverbench_test_" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := riverbench.CreateDatabase(ctx, cfg, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := riverbench.DropDatabase(ctx, cfg, name); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("TEST_DATABASE_URL must be a postgres:// URL")
	}
	u.Path = "/" + name
	return u.String()
}
