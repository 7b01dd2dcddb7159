package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/pgworker/pgworker/internal/testhelp"
)

// StartStandby makes a streaming standby of primary: a base backup taken
// with pg_basebackup -R (which writes primary_conninfo and standby.signal),
// started on a free loopback port of its own. The primary needs wal_level
// replica or higher (the default), free WAL senders (max_wal_senders
// defaults to 10) and a pg_hba.conf entry that lets it replicate to
// 127.0.0.1 (initdb --auth=trust writes one). Make it synchronous on the
// primary with synchronous_standby_names once it streams.
func StartStandby(ctx context.Context, primary *Cluster) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "pgworker-pg-standby-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, BinDir: fullBinDir(primary.BinDir), cred: primary.cred}
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := c.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port), "-U", "postgres",
		"-D", c.dataDir(), "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// The copied postgresql.conf names the primary's socket directory.
	f, err := os.OpenFile(filepath.Join(c.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	_, err = fmt.Fprintf(f, "\n# pgworker test standby\nunix_socket_directories = '%s'\nhot_standby = on\n", dir)
	f.Close()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for try := 0; ; try++ {
		if c.Port, err = testhelp.FreePort(); err != nil {
			break
		}
		if err = c.Start(ctx); err == nil || try == 4 {
			break
		}
	}
	if err != nil {
		log, _ := os.ReadFile(c.LogFile())
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	return c, nil
}

// Promote turns a standby into a primary (pg_ctl promote) and waits until
// it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	return c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-w", "-t", "120", "promote")
}

// fullBinDir returns bin, or, when bin only holds links to some of the
// server programs (initdb, pg_ctl and postgres on PATH), the directory they
// point to, which has the others too.
func fullBinDir(bin string) string {
	if _, err := os.Stat(filepath.Join(bin, "pg_basebackup")); err == nil {
		return bin
	}
	if p, err := filepath.EvalSymlinks(filepath.Join(bin, "pg_ctl")); err == nil {
		return filepath.Dir(p)
	}
	return bin
}
