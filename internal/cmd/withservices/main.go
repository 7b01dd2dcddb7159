// Command withservices starts the services the tests need, runs a command with
// their addresses in its environment, and stops them afterwards, also when the
// command fails or the run is interrupted.
//
//	go run ./internal/cmd/withservices -- go test -race ./...
//
// It starts a throwaway PostgreSQL cluster and sets TEST_DATABASE_URL, unless
// TEST_DATABASE_URL is already set. MinIO and PgBouncer are started by the tests
// that need them, from ./bin and the system's binaries.
//
// Each --setting 'NAME = VALUE' is a postgresql.conf line for the throwaway
// cluster, after its own (which make commits cheap: fsync off):
//
//	go run ./internal/cmd/withservices --setting 'fsync = on' -- ./bench/run.sh
//
// With --minio it also starts a throwaway MinIO server (bin/minio) and sets
// PGWORKER_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// AWS_REGION for the command, as pgworker reads them; each --bucket NAME
// (which implies --minio) is created first:
//
//	go run ./internal/cmd/withservices --minio --bucket bench -- pgworker bench pipeline ...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pgworker/pgworker/internal/miniotest"
	"github.com/pgworker/pgworker/internal/pgtest"
)

// list is a repeatable flag.
type list []string

func (b *list) String() string     { return strings.Join(*b, ",") }
func (b *list) Set(s string) error { *b = append(*b, s); return nil }

func main() {
	fs := flag.NewFlagSet("withservices", flag.ExitOnError)
	withMinIO := fs.Bool("minio", false, "also start a MinIO server and set PGWORKER_S3_ENDPOINT and the AWS_* credentials")
	var bs, settings list
	fs.Var(&bs, "bucket", "create this `bucket` in MinIO (repeatable; implies --minio)")
	fs.Var(&settings, "setting", "a postgresql.conf `line` for the throwaway cluster, such as 'fsync = on' (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: withservices [--setting 'NAME = VALUE']... [--minio] [--bucket NAME]... -- COMMAND [ARGS...]")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:]) // stops at --, which it consumes
	args := fs.Args()
	if len(args) == 0 {
		fs.Usage()
		os.Exit(2)
	}
	os.Exit(run(args, settings, *withMinIO || len(bs) > 0, bs))
}

func run(args, settings []string, withMinIO bool, bs []string) int {
	ctx := context.Background()
	env := os.Environ()
	if os.Getenv("TEST_DATABASE_URL") == "" {
		c, err := pgtest.StartCluster(ctx, &pgtest.ClusterConfig{Settings: settings})
		if err != nil {
			fmt.Fprintln(os.Stderr, "withservices: start PostgreSQL:", err)
			return 1
		}
		defer func() {
			if err := c.Destroy(); err != nil {
				fmt.Fprintln(os.Stderr, "withservices: stop PostgreSQL:", err)
			}
		}()
		fmt.Fprintf(os.Stderr, "withservices: PostgreSQL on port %d (log %s)\n", c.Port, c.LogFile())
		env = append(env, "TEST_DATABASE_URL="+c.URL("postgres"), "PG_BINDIR="+c.BinDir)
	}
	if withMinIO {
		srv, err := miniotest.Start(nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "withservices: start MinIO:", err)
			return 1
		}
		defer func() {
			if err := srv.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "withservices: stop MinIO:", err)
			}
		}()
		for _, b := range bs {
			if err := srv.MakeBucket(ctx, b); err != nil {
				fmt.Fprintf(os.Stderr, "withservices: create bucket %s: %v\n", b, err)
				return 1
			}
		}
		fmt.Fprintf(os.Stderr, "withservices: MinIO at %s (log %s)\n", srv.Endpoint, srv.LogFile())
		env = append(env, "PGWORKER_S3_ENDPOINT="+srv.Endpoint, "AWS_ACCESS_KEY_ID="+srv.AccessKey,
			"AWS_SECRET_ACCESS_KEY="+srv.SecretKey, "AWS_REGION=us-east-1")
	}

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "withservices:", err)
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
		fmt.Fprintln(os.Stderr, "withservices:", err)
		return 1
	}
}
