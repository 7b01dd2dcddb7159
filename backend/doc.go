// Package backend runs the user's program (the backend) on one job, safely:
// the command line is split into argv like a shell would split it but
// without any expansion, placeholders are filled in inside the words, and
// the program is executed directly, with no shell in between, in its own
// process group that is killed as a whole on timeout or cancellation.
//
//	r, err := backend.New(&backend.Config{
//		Command: `convert {input} -resize 50% "{output_dir}/small.png"`,
//		Timeout: 10 * time.Minute,
//		Logger:  logger,
//	})
//	if err != nil {
//		return err // bad syntax, unknown placeholder, program not found
//	}
//	res, err := r.Run(ctx, &backend.Job{
//		ID: 42, Queue: "default", Source: "photos/a b.jpg", Attempt: 1,
//		Input: "/var/lib/pgworker/slot-0/input/a b.jpg",
//		OutputDir: "/var/lib/pgworker/slot-0/output",
//		WorkDir: "/var/lib/pgworker/slot-0",
//	})
//	switch {
//	case err == nil: // exit status 0
//	case backend.Permanent(err): // not found, not executable: fail the row for good
//	default: // exit status, signal, timeout, cancellation: res tells which
//	}
//
// # Command lines
//
// Split describes the quoting rules: single quotes, double quotes (where \
// escapes " \ $ ` and newline), backslash escapes outside quotes, blanks
// between words. $VAR, $(...), `...`, globs (*, ?), ~, ;, |, &&, >, # are
// ordinary characters: nothing is expanded, substituted, globbed or
// redirected. A program that needs a shell says so: --exec 'sh -c "..."'
// (and then the shell interprets the string; placeholders should then be
// passed as arguments, sh -c '... "$1"' sh {input}, never pasted into it).
//
// Placeholders ({input}, {output_dir}, {id}, {source}, {attempt}, {queue},
// {work_dir}) are replaced after splitting, inside the words, so a value
// never becomes more than one argument and is never interpreted. {{ and }}
// are literal braces; any other { or } is an error when the command is
// parsed.
//
// # Environment
//
// The program inherits the worker's environment minus the worker's
// credentials and configuration (see SecretEnv), plus the PGWORKER_*
// variables of the job (see JobEnv).
package backend
