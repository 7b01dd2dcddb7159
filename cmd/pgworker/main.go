// Command pgworker runs a program on every object listed in a PostgreSQL
// work queue, and manages the queue. See 'pgworker --help'; the logic lives
// in package cli.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/pgworker/pgworker/backend"
	"github.com/pgworker/pgworker/cli"
)

func main() {
	// The programs that `pgworker run` starts must not read this process's
	// environment (its credentials) through /proc, and what they leave
	// running must come back here to be killed: see package backend.
	if err := backend.HideProcess(); err != nil {
		fmt.Fprintln(os.Stderr, "pgworker: warning:", err)
	}
	if err := backend.BecomeSubreaper(); err != nil {
		fmt.Fprintln(os.Stderr, "pgworker: warning:", err)
	}
	code := cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	backend.KillOrphans(nil)
	os.Exit(code)
}
