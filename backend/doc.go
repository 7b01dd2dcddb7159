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
// variables of the job (see JobEnv). The payload is always in a file of the
// work directory ({payload_file}, PGWORKER_PAYLOAD_FILE, mode 0600), and in
// PGWORKER_PAYLOAD only up to PayloadEnvMax bytes: the kernel refuses to
// start a program with a larger variable. An argument or environment over
// the kernel's limits fails the run with ErrArgTooLong, which Permanent
// reports: running it again would fail the same way.
//
// # Output
//
// Stdout and stderr are logged line by line (each line cut at
// Config.MaxLineBytes) within a budget per run (Config.LogLines and
// Config.LogBytes); past it, one line says how many more were not logged.
// The end of stderr is kept in Result.StderrTail whatever the budget.
//
// # What a program can reach
//
// A program that runs as the worker's own user could read the worker's
// environment (the database URL, the object store's keys) and memory
// through /proc/PPID; HideProcess, called once at start, closes that.
// Config.RunAs runs the program as another user (the worker must start as
// root): Run hands the job's work directory tree to that user, and the
// worker's /proc files are closed to it whatever the worker does.
// /proc/PID/cmdline is readable by every user: secrets never go in flags.
//
// # What a run leaves behind
//
// When a run ends, by exit, timeout, cancellation or the worker's stop, its
// process group is killed. In a process that called BecomeSubreaper (as
// pgworker does), processes the program left in sessions or groups of
// their own (setsid, a daemon's double fork) come back to the worker when
// their parents exit, and the run kills those that carry its
// PGWORKER_RUN_ID, with their descendants, before Run returns; KillOrphans
// kills the rest of them when the worker stops. Not covered: a process that
// cleared its environment and left the group, and what is left running
// when the worker itself is killed with SIGKILL (a cgroup per worker, such
// as systemd's KillMode=control-group, covers both).
package backend
