package main

import (
	"strings"
	"testing"

	"github.com/pgworker/pgworker/internal/pgworkerbin"
)

// The command's behaviour is tested in package cli; this checks that the
// binary is wired to it: exit statuses and output streams.
func TestBinary(t *testing.T) {
	bin, err := pgworkerbin.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	env := pgworkerbin.Env()
	if res := pgworkerbin.Run(t, bin, nil, env, "version"); res.Code != 0 || !strings.HasPrefix(res.Stdout, "pgworker ") {
		t.Errorf("version: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	if res := pgworkerbin.Run(t, bin, nil, env, "--help"); res.Code != 0 || !strings.Contains(res.Stdout, "Usage: pgworker COMMAND") {
		t.Errorf("--help: exit %d, stdout %q", res.Code, res.Stdout)
	}
	if res := pgworkerbin.Run(t, bin, nil, env, "no-such-command"); res.Code != 2 || res.Stdout != "" || len(pgworkerbin.Lines(res.Stderr)) != 1 {
		t.Errorf("unknown command: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	if res := pgworkerbin.Run(t, bin, nil, env, "status"); res.Code != 2 || !strings.Contains(res.Stderr, "missing database URL") {
		t.Errorf("status without a database: exit %d, stderr %q", res.Code, res.Stderr)
	}
}
