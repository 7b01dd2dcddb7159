// Package pgtest gives each test its own PostgreSQL database, cloned from a
// template that the migrations built once, so tests run in parallel against a
// real server and never see each other's rows.
//
// The server is named by TEST_DATABASE_URL (make test starts a throwaway
// cluster and sets it). The template's name carries a hash of the migrations,
// so a changed migration builds a new template.
//
//	func TestSomething(t *testing.T) {
//		pool := pgtest.Pool(t)
//		...
//	}
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgworker/pgworker/internal/testhelp"
	"github.com/pgworker/pgworker/migrations"
)

// ServerURL returns TEST_DATABASE_URL, failing the test when it is not set.
func ServerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("TEST_DATABASE_URL")
	if u == "" {
		t.Fatal("TEST_DATABASE_URL is not set: run the tests with `make test`, which starts a PostgreSQL server, " +
			"or point TEST_DATABASE_URL at a server where this user may create databases")
	}
	return u
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// URL creates a fresh, migrated database for the test and returns its URL. The
// database is dropped when the test ends.
func URL(t testing.TB) string {
	t.Helper()
	server := ServerURL(t)
	templateOnce.Do(func() { templateName, templateErr = buildTemplate(server) })
	if templateErr != nil {
		t.Fatalf("build template database: %v", templateErr)
	}
	name := "pgworker_test_" + testhelp.RandomHex(6)
	ctx := context.Background()
	conn := connect(t, server)
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, templateName)); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() { DropDatabase(t, server, name) })
	return WithDatabase(t, server, name)
}

// EmptyURL creates a fresh database without the schema, dropped at the end of
// the test: for tests of the migrations themselves.
func EmptyURL(t testing.TB) string {
	t.Helper()
	server := ServerURL(t)
	name := "pgworker_empty_" + testhelp.RandomHex(6)
	ctx := context.Background()
	conn := connect(t, server)
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create empty database: %v", err)
	}
	t.Cleanup(func() { DropDatabase(t, server, name) })
	return WithDatabase(t, server, name)
}

// Pool returns a pool on a fresh, migrated database, closed at the end of the test.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return PoolFor(t, URL(t))
}

// PoolFor opens a pool on url, closed at the end of the test; each tune
// adjusts its configuration first.
func PoolFor(t testing.TB, url string, tune ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	for _, f := range tune {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// WithDatabase returns server with its database name replaced by name.
func WithDatabase(t testing.TB, server, name string) string {
	t.Helper()
	u, err := url.Parse(server)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// DropDatabase drops a database, disconnecting whoever is still on it.
func DropDatabase(t testing.TB, server, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Errorf("drop database %s: %v", name, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
		t.Errorf("drop database %s: %v", name, err)
	}
}

func connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatalf("connect to test server: %v", err)
	}
	return conn
}

// buildTemplate migrates a template database once per migration content. Test
// binaries run in parallel, so an advisory lock on the server serialises them.
func buildTemplate(server string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hash, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "pgworker_template_" + hash[:12]

	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext('pgworker test template'))"); err != nil {
		return "", err
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext('pgworker test template'))") //nolint:errcheck

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_building"
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", err
	}
	u, err := url.Parse(server)
	if err != nil {
		return "", err
	}
	u.Path = "/" + building
	if err := MigrateUp(ctx, u.String()); err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, name)); err != nil {
		return "", err
	}
	return name, nil
}

// MigrateUp applies every migration to the database at url.
func MigrateUp(ctx context.Context, url string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return err
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		return err
	}
	_, err = p.Up(ctx)
	return err
}

func migrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".sql") {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		h.Write([]byte(path))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", errors.New("hash migrations: " + err.Error())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// EndSession ends the session of the one connection to url's database whose
// application_name is app, as a server restart or an operator would, and
// waits until it is gone.
func EndSession(t testing.TB, url, app string) {
	t.Helper()
	ctx := context.Background()
	conn := connect(t, url)
	defer conn.Close(ctx)
	var pid int32
	if err := conn.QueryRow(ctx, `SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, app).Scan(nil, &pid); err != nil {
		t.Fatalf("end the session of %s: %v", app, err)
	}
	testhelp.WaitEvery(t, 2*time.Minute, 10*time.Millisecond, "the session of "+app+" to end", func() bool {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}
