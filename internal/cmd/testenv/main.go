// Command testenv starts the services the tests need, runs a command with
// their addresses in its environment, and stops them afterwards, also when the
// command fails or the run is interrupted.
//
//	go run ./internal/cmd/testenv -- go test -race ./...
//
// It starts a throwaway PostgreSQL cluster and sets TEST_DATABASE_URL, unless
// TEST_DATABASE_URL is already set. MinIO and PgBouncer are started by the tests
// that need them, from ./bin and the system's binaries.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/pgworker/pgworker/internal/pgtest"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testenv -- COMMAND [ARGS...]")
		os.Exit(2)
	}
	os.Exit(run(args))
}

func run(args []string) int {
	ctx := context.Background()
	env := os.Environ()
	if os.Getenv("TEST_DATABASE_URL") == "" {
		c, err := pgtest.StartCluster(ctx, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testenv: start PostgreSQL:", err)
			return 1
		}
		defer func() {
			if err := c.Destroy(); err != nil {
				fmt.Fprintln(os.Stderr, "testenv: stop PostgreSQL:", err)
			}
		}()
		fmt.Fprintf(os.Stderr, "testenv: PostgreSQL on port %d (log %s)\n", c.Port, c.LogFile())
		env = append(env, "TEST_DATABASE_URL="+c.URL("postgres"), "PG_BINDIR="+c.BinDir)
	}

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	signal.Stop(sigs)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		if exit.ExitCode() < 0 {
			return 1
		}
		return exit.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
}
