package migrations_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/migrations"
)

// schemaObjects counts what the migrations create, to prove that down removes it all.
const schemaObjects = `
SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = 'files')
     + (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'files')
     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'files')`

func countObjects(t *testing.T, url string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, schemaObjects).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestGooseCLIRoundTrip(t *testing.T) {
	t.Parallel()
	goose := toolPath(t, "goose")
	url := pgtest.EmptyURL(t)
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(goose, append([]string{"-dir", ".", "postgres", url}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("goose %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	run("up")
	up := countObjects(t, url)
	if up < 20 {
		t.Fatalf("after up: %d objects in schema files, want the whole schema", up)
	}
	run("down-to", "0")
	if n := countObjects(t, url); n != 0 {
		t.Fatalf("after down-to 0: %d objects of schema files remain", n)
	}
	run("up")
	if n := countObjects(t, url); n != up {
		t.Fatalf("after up again: %d objects, want %d", n, up)
	}
}

func TestProviderRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.EmptyURL(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up: %v", err)
	}
	up := countObjects(t, url)
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatalf("down to 0: %v", err)
	}
	if n := countObjects(t, url); n != 0 {
		t.Fatalf("after down to 0: %d objects of schema files remain", n)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if n := countObjects(t, url); n != up {
		t.Fatalf("after up again: %d objects, want %d", n, up)
	}
}

// TestDownRestoresEachVersion checks every Down: a database migrated up and
// then down to version n has the catalog of one migrated up to n only.
func TestDownRestoresEachVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	down := provider(t, pgtest.EmptyURL(t))
	if _, err := down.p.Up(ctx); err != nil {
		t.Fatalf("up: %v", err)
	}
	sources := down.p.ListSources()
	for i := len(sources) - 2; i >= 0; i-- {
		v := sources[i].Version
		if _, err := down.p.DownTo(ctx, v); err != nil {
			t.Fatalf("down to %d: %v", v, err)
		}
		up := provider(t, pgtest.EmptyURL(t))
		if _, err := up.p.UpTo(ctx, v); err != nil {
			t.Fatalf("up to %d: %v", v, err)
		}
		if got, want := dumpSchema(t, down.url), dumpSchema(t, up.url); got != want {
			t.Errorf("down to version %d leaves another schema than up to it:\n%s",
				v, diffLines("up to it", want, "down to it", got))
		}
	}
}

type migrated struct {
	url string
	p   *goose.Provider
}

// provider returns a goose provider of migrations.FS on the database at url.
func provider(t *testing.T, url string) migrated {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	return migrated{url: url, p: p}
}

// TestSchemaFileMatchesMigrations builds one database with the migrations and
// one from sql/schema.sql, and compares what pg_dump says of schema files in
// each: every table, column, constraint, index, trigger, function body and
// setting, view, comment, grant, and the rows the schema starts with. Both
// sides are written by hand, so an edit of one alone fails here.
func TestSchemaFileMatchesMigrations(t *testing.T) {
	t.Parallel()
	migrated := pgtest.URL(t)
	scripted := pgtest.EmptyURL(t)
	psql := pgTool(t, "psql")
	out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-1", "-f", "../sql/schema.sql", scripted).CombinedOutput()
	if err != nil {
		t.Fatalf("psql -f sql/schema.sql: %v\n%s", err, out)
	}
	want := dumpSchema(t, migrated)
	got := dumpSchema(t, scripted)
	if got != want {
		t.Fatalf("sql/schema.sql and migrations/ build different schemas: make each change in both (migrations/README.md)\n%s",
			diffLines("migrations/", want, "sql/schema.sql", got))
	}
}

// dumpNoise is what differs between two dumps of equal schemas: comments
// (but the "-- Name: ..." line that heads each object), session settings and
// the random key of \restrict.
var dumpNoise = regexp.MustCompile(`(?m)^(--( [^N].*|)|SET .*|SELECT pg_catalog\.set_config.*|\\(un)?restrict .*)$`)

// dumpSchema returns pg_dump's script of schema files at url, without noise.
func dumpSchema(t *testing.T, url string) string {
	t.Helper()
	out, err := exec.Command(pgTool(t, "pg_dump"), "--schema=files", "--no-owner", url).Output()
	if err != nil {
		t.Fatalf("pg_dump: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(dumpNoise.ReplaceAllString(string(out), ""), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// diffLines names the object where two dumps first differ and shows a few
// lines of each from there.
func diffLines(wantName, want, gotName, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	object := "(start of the dump)"
	for j := i - 1; j >= 0; j-- {
		if strings.HasPrefix(w[j], "-- Name: ") {
			object = strings.TrimPrefix(w[j], "-- ")
			break
		}
	}
	excerpt := func(lines []string) string {
		end := min(i+4, len(lines))
		if i >= end {
			return "    (nothing)"
		}
		return "    " + strings.Join(lines[i:end], "\n    ")
	}
	return fmt.Sprintf("first difference at line %d, in %s\n%s:\n%s\n%s:\n%s",
		i+1, object, wantName, excerpt(w), gotName, excerpt(g))
}

// toolPath finds a pinned tool that make tools installs into ./bin.
func toolPath(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s not found in ./bin: run make tools", name)
	}
	return p
}

// pgTool finds a PostgreSQL client program next to the server binaries, or on PATH.
func pgTool(t *testing.T, name string) string {
	t.Helper()
	if dir, err := pgtest.BinDir(); err == nil {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: install the PostgreSQL client", name)
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestOpsScripts runs every operator script with psql on a database with some
// history, as a DBA would.
func TestOpsScripts(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	mustExec(t, pool, "INSERT INTO files.files (source, max_attempts) SELECT 'o' || g, 1 FROM generate_series(1, 10) g")
	mustExec(t, pool, "SELECT files.fail(id, worker_id, attempt, claim_token, 'bad input') FROM files.claim('ops', NULL, 3, key => 'test-key-0123456789')")
	mustExec(t, pool, "SELECT files.complete(id, worker_id, attempt, claim_token, '{}') FROM files.claim('ops', NULL, 3, key => 'test-key-0123456789')")
	mustExec(t, pool, "SELECT count(*) FROM files.claim('ops', NULL, 2, key => 'test-key-0123456789')")

	scripts, err := filepath.Glob("../sql/ops/*.sql")
	if err != nil || len(scripts) < 5 {
		t.Fatalf("ops scripts: %v %v", scripts, err)
	}
	// Requeueing changes what the others show: run it last.
	sort.SliceStable(scripts, func(i, j int) bool {
		return !strings.Contains(scripts[i], "requeue") && strings.Contains(scripts[j], "requeue")
	})
	psql := pgTool(t, "psql")
	for _, s := range scripts {
		out, err := exec.Command(psql, "-X", "-v", "ON_ERROR_STOP=1", "-v", "queue=default", "-f", s, url).CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v\n%s", s, err, out)
		}
		if filepath.Base(s) == "stuck_and_failed.sql" && !strings.Contains(string(out), "bad input") {
			t.Errorf("%s does not show the failed rows' error:\n%s", s, out)
		}
		if filepath.Base(s) == "requeue_failed.sql" && !regexp.MustCompile(`(?m)^\s+3$`).Match(out) {
			t.Errorf("%s did not requeue the 3 failed rows:\n%s", s, out)
		}
	}
}
