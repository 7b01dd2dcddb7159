package cli_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/pgworkerbin"
)

// bin is the pgworker binary the tests drive.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgworker-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, err = pgworkerbin.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// pgworker runs the binary against the database at url (none if "").
func pgworker(t *testing.T, url, stdin string, args ...string) pgworkerbin.Result {
	t.Helper()
	var env []string
	if url != "" {
		env = append(env, "PGWORKER_DATABASE_URL="+url)
	}
	return pgworkerbin.Run(t, bin, strings.NewReader(stdin), pgworkerbin.Env(env...), args...)
}

// ok runs the binary and fails the test unless it exits 0 with an empty stderr.
func ok(t *testing.T, url, stdin string, args ...string) string {
	t.Helper()
	res := pgworker(t, url, stdin, args...)
	if res.Code != 0 || res.Stderr != "" {
		t.Fatalf("pgworker %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.Code, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// fails runs the binary and checks that it exits with code and one line on
// stderr that holds each of want.
func fails(t *testing.T, url, stdin string, code int, want []string, args ...string) string {
	t.Helper()
	res := pgworker(t, url, stdin, args...)
	if res.Code != code {
		t.Errorf("pgworker %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.Code, code, res.Stdout, res.Stderr)
	}
	lines := pgworkerbin.Lines(res.Stderr)
	if len(lines) != 1 {
		t.Errorf("pgworker %s: stderr has %d lines, want one:\n%s", strings.Join(args, " "), len(lines), res.Stderr)
	}
	for _, w := range want {
		if !strings.Contains(res.Stderr, w) {
			t.Errorf("pgworker %s: stderr lacks %q:\n%s", strings.Join(args, " "), w, res.Stderr)
		}
	}
	return res.Stderr
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func newDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.URL(t)
	return url, pgtest.PoolFor(t, url)
}
