package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
)

// Exit statuses of Main.
const (
	ExitOK    = 0 // the command did what was asked
	ExitError = 1 // a runtime error: database unreachable, bad input line, ...
	ExitUsage = 2 // a mistake in the command line or configuration
)

// Config lets a Go program build its own pgworker command with the parts
// that this package does not provide by itself. A nil Config works.
type Config struct {
	// OpenLister opens the location given to `pgworker enqueue --from`
	// (s3://bucket/prefix, file:///dir). Defaults to listing a blob store;
	// each object is enqueued by its full URL.
	OpenLister func(ctx context.Context, uri string) (Lister, error)

	// RunWorkers runs `pgworker run` once its flags are checked: see
	// RunConfig. Defaults to runWorkers.
	RunWorkers func(ctx context.Context, cfg *RunConfig) error

	// LookupEnv reads the environment twins of the flags. Defaults to
	// os.LookupEnv.
	LookupEnv func(name string) (string, bool)
}

// CLI is the pgworker command line.
type CLI struct {
	cfg      Config
	commands []*entry // in the order pgworker --help lists them
}

// entry is a subcommand: its description and what runs it.
type entry struct {
	*command
	run func(ctx context.Context, e *env, args []string) error
}

// env is what a command runs with.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	lookup         func(string) (string, bool)
}

// New returns the command line with cfg's parts.
func New(cfg *Config) *CLI {
	c := &CLI{}
	if cfg != nil {
		c.cfg = *cfg
	}
	if c.cfg.RunWorkers == nil {
		c.cfg.RunWorkers = runWorkers
	}
	if c.cfg.OpenLister == nil {
		c.cfg.OpenLister = openStoreLister
	}
	if c.cfg.LookupEnv == nil {
		c.cfg.LookupEnv = os.LookupEnv
	}
	c.commands = []*entry{
		{migrateCommand, c.migrate},
		{enqueueCommand, c.enqueue},
		{runCommand, c.run},
		{statusCommand, c.status},
		{waitCommand, c.wait},
		{resultsCommand, c.results},
		{scaleHintCommand, c.scaleHint},
		{retryCommand, c.retry},
		{cancelCommand, c.cancel},
		{pauseCommand, c.pause},
		{resumeCommand, c.resume},
		{pruneCommand, c.prune},
		{retentionCommand, c.retention},
		{queueSetCommand, c.queueSet},
		{dashboardCommand, c.dashboard},
		{versionCommand, c.version},
		{benchCommand, c.bench},
	}
	return c
}

// Main runs pgworker with the arguments after the program name and returns
// the exit status: ExitOK, ExitError or ExitUsage.
//
//	func main() {
//		os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
//	}
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return New(nil).Main(ctx, args, stdin, stdout, stderr)
}

// Main runs the command line; see the package function Main. A nil stdin
// reads as empty.
func (c *CLI) Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, lookup: c.cfg.LookupEnv}
	if len(args) == 0 {
		c.printOverview(stderr)
		return ExitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && name == "help" {
			if cmd := c.command(rest[0]); cmd != nil {
				return c.finish(e, cmd.name, cmd.run(ctx, e, append(rest[1:], "--help")))
			}
		}
		c.printOverview(stdout)
		return ExitOK
	case "-version", "--version":
		name = "version"
	}
	cmd := c.command(name)
	if cmd == nil {
		fmt.Fprintf(stderr, "pgworker: unknown command %q (run 'pgworker --help' for the list)\n", name)
		return ExitUsage
	}
	if name != "run" {
		// run handles signals itself: the first drains, the second stops.
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	return c.finish(e, name, cmd.run(ctx, e, rest))
}

// command returns the command called name, or nil.
func (c *CLI) command(name string) *entry {
	for _, e := range c.commands {
		if e.name == name {
			return e
		}
	}
	return nil
}

// finish prints err as one line, with what could drive a terminal escaped,
// and returns the exit status.
func (c *CLI) finish(e *env, name string, err error) int {
	if err == nil {
		return ExitOK
	}
	msg := printable(strings.Join(strings.Fields(err.Error()), " "))
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(e.stderr, "pgworker %s: %s\n", name, msg)
		return ExitUsage
	}
	var xe *exitError
	if errors.As(err, &xe) {
		fmt.Fprintf(e.stderr, "pgworker %s: %s\n", name, msg)
		return xe.code
	}
	if errors.Is(err, context.Canceled) {
		msg = "interrupted: " + msg
	}
	fmt.Fprintf(e.stderr, "pgworker: %s\n", msg)
	return ExitError
}

// parseFlags parses a command's flags; help is true when --help was asked
// for and printed.
func (e *env) parseFlags(fs *flagSet, args []string) (help bool, err error) {
	err = fs.parse(args, e.lookup)
	if errors.Is(err, flag.ErrHelp) {
		fs.printHelp(e.stdout)
		return true, nil
	}
	if err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			ue.msg += fmt.Sprintf(" (see 'pgworker %s --help')", fs.cmd.name)
		}
	}
	return false, err
}

func (c *CLI) printOverview(w io.Writer) {
	fmt.Fprint(w, `pgworker runs a program on every object listed in a PostgreSQL work queue.

Usage: pgworker COMMAND [flags] [arguments]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, cmd := range c.commands {
		fmt.Fprintf(tw, "  %s\t%s\n", cmd.name, cmd.summary)
	}
	tw.Flush()
	fmt.Fprint(w, `
Every flag has an environment twin, shown in each command's help as [$NAME];
a flag on the command line wins over its twin.

Quick start:
  export PGWORKER_DATABASE_URL=postgres://app@db:5432/queue   # the password in ~/.pgpass
  pgworker migrate up
  ls photos/ | pgworker enqueue --queue thumbs
  pgworker run --queue thumbs --input-store file:///srv/photos --output-store file:///srv/thumbs \
      --exec 'convert {input} -thumbnail 200x200 {output_dir}/thumb.jpg'
  pgworker status

Run 'pgworker COMMAND --help' for a command's flags and examples.
`)
}
