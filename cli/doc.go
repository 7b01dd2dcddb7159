// Package cli is the pgworker command line as a library: cmd/pgworker is a
// thin main around it, and a Go program can build its own pgworker with
// other parts (an object-store lister for enqueue --from, its own worker
// runtime for run).
//
//	func main() {
//		os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
//	}
//
// or, with parts of one's own:
//
//	c := cli.New(&cli.Config{
//		OpenLister: func(ctx context.Context, uri string) (cli.Lister, error) { ... },
//	})
//	os.Exit(c.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
//
// 'pgworker --help' lists the commands; each has --help with examples. The
// producer and operator commands are a layer over package queue, which a Go
// program calls directly to enqueue without shelling out. Every flag
// has an environment twin (--database-url: PGWORKER_DATABASE_URL, then
// DATABASE_URL); the command line wins. Errors are one line on stderr; the
// exit status is 0 on success, 1 for runtime errors and 2 for usage errors.
// Passwords in database URLs are never printed (see RedactURL).
package cli
