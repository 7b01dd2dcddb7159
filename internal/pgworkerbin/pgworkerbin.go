// Package pgworkerbin builds the pgworker binary once per test binary and runs
// it as a user would: arguments, environment and standard input in; exit
// status, standard output and standard error out.
//
//	var bin string
//
//	func TestMain(m *testing.M) {
//		dir, _ := os.MkdirTemp("", "pgworker-bin-")
//		var err error
//		if bin, err = pgworkerbin.Build(dir); err != nil {
//			fmt.Fprintln(os.Stderr, err)
//			os.Exit(1)
//		}
//		code := m.Run()
//		os.RemoveAll(dir)
//		os.Exit(code)
//	}
//
//	func TestStatus(t *testing.T) {
//		res := pgworkerbin.Run(t, bin, nil, pgworkerbin.Env("PGWORKER_DATABASE_URL="+pgtest.URL(t)), "status")
//		...
//	}
package pgworkerbin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Build compiles cmd/pgworker into dir, with the race detector when the
// tests run with it, and returns the binary's path.
func Build(dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("build pgworker: the go tool is not in PATH: %w", err)
	}
	bin := filepath.Join(dir, "pgworker")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/pgworker/pgworker/cmd/pgworker")
	cmd := exec.Command(goTool, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build pgworker: %v\n%s", err, out.String())
	}
	return bin, nil
}

// Result is how a run of the binary ended.
type Result struct {
	Code   int
	Stdout string
	Stderr string
}

// Lines returns the non-empty lines of s.
func Lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// Run runs bin with args, env (see Env) and stdin (nil: empty), and fails
// the test if it does not end within two minutes.
func Run(t testing.TB, bin string, stdin io.Reader, env []string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("pgworker %s did not end within 2 minutes\nstderr: %s", strings.Join(args, " "), res.Stderr)
	case errors.As(err, &exitErr):
		res.Code = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("run pgworker %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// Env returns the test process's environment without the variables that
// configure pgworker or libpq (so that the machine's settings cannot leak
// into a test), plus extra.
func Env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PGWORKER_") || strings.HasPrefix(name, "PG") || name == "DATABASE_URL" || name == "GORACE" || name == "NO_COLOR" {
			continue
		}
		env = append(env, kv)
	}
	// A -race binary otherwise sleeps a second before it exits.
	env = append(env, "GORACE=atexit_sleep_ms=0")
	return append(env, extra...)
}

// ClosedURL returns a database URL, with a password, whose port nobody
// listens on.
func ClosedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "postgres://app:Sup3rS3cretPw@" + addr + "/queue?sslmode=disable"
}
