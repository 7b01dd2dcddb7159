package deploy_test

import (
	"context"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/blob"
)

func TestEnvFile(t *testing.T) {
	t.Parallel()
	text := read(t, envFile)
	entries := parseEnvFile(t, envFile, text)
	env := envMap(entries)
	seen := map[string]bool{}
	for _, e := range entries {
		if seen[e.Name] {
			t.Errorf("%s:%d: %s set twice", envFile, e.Line, e.Name)
		}
		seen[e.Name] = true
		if e.Comment == "" {
			t.Errorf("%s:%d: %s has no comment explaining it", envFile, e.Line, e.Name)
		}
	}
	for _, name := range []string{
		"PGWORKER_DATABASE_URL", "PGWORKER_LISTEN_URL", "PGWORKER_STATEMENT_MODE",
		"PGWORKER_INPUT_STORE", "PGWORKER_OUTPUT_STORE", "PGWORKER_S3_ENDPOINT",
		"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PGWORKER_EXEC", "PGWORKER_SLOTS",
		"PGWORKER_QUEUES", "PGWORKER_DRAIN_TIMEOUT", "PGWORKER_KILL_GRACE", "PGWORKER_WORK_DIR",
	} {
		if _, ok := env[name]; !ok {
			t.Errorf("the env file does not set %s", name)
		}
	}
	// Secrets are placeholders, and say that they are secrets.
	for _, name := range []string{"PGWORKER_DATABASE_URL", "PGWORKER_LISTEN_URL", "AWS_SECRET_ACCESS_KEY"} {
		for _, e := range entries {
			if e.Name != name {
				continue
			}
			if !strings.Contains(e.Value, placeholder) {
				t.Errorf("%s holds a secret but no %s placeholder: %q", name, placeholder, e.Value)
			}
			if !strings.Contains(e.Comment, "SECRET") {
				t.Errorf("%s holds a secret but its comment does not say SECRET", name)
			}
		}
	}
	if !strings.Contains(text, "0600") {
		t.Error("the env file does not say to install it with mode 0600")
	}

	// Through PgBouncer's transaction pool, statements go unprepared, and
	// LISTEN goes to the session pool entry.
	pgb := parseINI(t, read(t, pgbouncerFile))
	dbCfg, err := pgx.ParseConfig(env["PGWORKER_DATABASE_URL"])
	if err != nil {
		t.Fatalf("PGWORKER_DATABASE_URL: %v", err)
	}
	listenCfg, err := pgx.ParseConfig(env["PGWORKER_LISTEN_URL"])
	if err != nil {
		t.Fatalf("PGWORKER_LISTEN_URL: %v", err)
	}
	if mode := connParams(pgb["databases"][dbCfg.Database])["pool_mode"]; mode != "transaction" {
		t.Errorf("PGWORKER_DATABASE_URL's database %q is not a transaction pool entry of pgbouncer.ini (pool_mode %q)", dbCfg.Database, mode)
	}
	if mode := connParams(pgb["databases"][listenCfg.Database])["pool_mode"]; mode != "session" {
		t.Errorf("PGWORKER_LISTEN_URL's database %q is not a session pool entry of pgbouncer.ini (pool_mode %q)", listenCfg.Database, mode)
	}
	if port := pgb["pgbouncer"]["listen_port"]; itoa(int(dbCfg.Port)) != port || itoa(int(listenCfg.Port)) != port {
		t.Errorf("the URLs' ports (%d, %d) are not PgBouncer's listen_port %s", dbCfg.Port, listenCfg.Port, port)
	}
	if m := env["PGWORKER_STATEMENT_MODE"]; m != "exec" && m != "simple" {
		t.Errorf("PGWORKER_STATEMENT_MODE=%q through a transaction pool: want exec or simple", m)
	}
	for _, name := range []string{"PGWORKER_DATABASE_URL", "PGWORKER_LISTEN_URL"} {
		if u, _ := url.Parse(env[name]); u.Query().Get("sslmode") == "" || u.Query().Get("sslmode") == "disable" {
			t.Errorf("%s does not ask for TLS (sslmode), which pgbouncer.ini requires", name)
		}
	}
	if h, err := time.ParseDuration(env["PGWORKER_HEARTBEAT"]); err != nil {
		t.Errorf("PGWORKER_HEARTBEAT: %v", err)
	} else if l, err := time.ParseDuration(env["PGWORKER_LEASE_TIMEOUT"]); err != nil || l < 2*h {
		t.Errorf("PGWORKER_LEASE_TIMEOUT=%s (%v): want at least two heartbeats (%s)", env["PGWORKER_LEASE_TIMEOUT"], err, h)
	}
	if _, err := time.ParseDuration(env["PGWORKER_TIMEOUT"]); err != nil {
		t.Errorf("PGWORKER_TIMEOUT: %v", err)
	}
	for _, name := range []string{"PGWORKER_INPUT_STORE", "PGWORKER_OUTPUT_STORE"} {
		if _, err := blob.ParseURL(env[name]); err != nil {
			t.Errorf("%s=%s: %v", name, env[name], err)
		}
	}
	if !strings.HasPrefix(env["PGWORKER_EXEC"], backendMount+"/") {
		t.Errorf("PGWORKER_EXEC=%q: the example backend should live on the NFS mount %s", env["PGWORKER_EXEC"], backendMount)
	}
}

// TestEnvFileMatchesCLI builds pgworker and checks that it reads every
// PGWORKER_ variable the env file sets: a misspelt name would be ignored
// silently.
func TestEnvFileMatchesCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds pgworker")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH: cannot build pgworker to compare its flags with the env file")
	}
	bin := filepath.Join(t.TempDir(), "pgworker")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, "./cmd/pgworker")
	build.Dir = moduleRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pgworker: %v\n%s", err, out)
	}
	help, err := exec.CommandContext(ctx, bin, "run", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("pgworker run --help: %v\n%s", err, help)
	}
	known := map[string]bool{}
	// Each flag's help ends with its variables: [$PGWORKER_X, $OTHER].
	for _, group := range regexp.MustCompile(`\[(\$[^\]]+)\]`).FindAllSubmatch(help, -1) {
		for _, m := range regexp.MustCompile(`\$([A-Z][A-Z0-9_]*)`).FindAllSubmatch(group[1], -1) {
			known[string(m[1])] = true
		}
	}
	if len(known) == 0 {
		t.Fatalf("pgworker run --help names no environment variables:\n%s", help)
	}

	env := parseEnvFile(t, envFile, read(t, envFile))
	// The object store settings are read by package blob, not by flags:
	// check them through it.
	blobVars := map[string]func(blob.Options) string{
		"PGWORKER_S3_ENDPOINT": func(o blob.Options) string { return o.Endpoint },
		"PGWORKER_S3_CA_FILE":  func(o blob.Options) string { return o.CAFile },
	}
	for _, e := range env {
		if get, ok := blobVars[e.Name]; ok {
			t.Setenv(e.Name, "/probe/"+e.Name)
			o, err := blob.OptionsFromEnv()
			if err != nil || get(o) != "/probe/"+e.Name {
				t.Errorf("%s: blob.OptionsFromEnv does not read it (%v)", e.Name, err)
			}
			continue
		}
		if strings.HasPrefix(e.Name, "PGWORKER_") && !known[e.Name] {
			t.Errorf("%s:%d: pgworker run does not read %s (its variables: %v)", envFile, e.Line, e.Name, keys(known))
		}
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
