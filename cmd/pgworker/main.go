// Command pgworker runs a program on every object listed in a PostgreSQL
// work queue, and manages the queue. See 'pgworker --help'; the logic lives
// in package cli.
package main

import (
	"context"
	"os"

	"github.com/pgworker/pgworker/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
