package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgworker/pgworker/internal/testhelp"
)

// Cluster is a throwaway PostgreSQL server in a temporary directory, on a free
// loopback port. Tests that restart or stop the server start their own; the
// rest share the one that make test starts.
type Cluster struct {
	Dir    string // holds data/, the log and the socket
	Port   int
	BinDir string

	cred *syscall.Credential
}

// ClusterConfig tunes StartCluster. A nil config works.
type ClusterConfig struct {
	// Settings are extra postgresql.conf lines, such as "max_connections = 500".
	Settings []string
}

// StartCluster initialises and starts a new cluster. When running as root it
// runs the server as the postgres OS user, since PostgreSQL refuses root.
func StartCluster(ctx context.Context, cfg *ClusterConfig) (*Cluster, error) {
	if cfg == nil {
		cfg = &ClusterConfig{}
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgworker-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, BinDir: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs a postgres OS user to run the server: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := c.run(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	settings := append([]string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = '" + dir + "'",
		"fsync = off", // a crash of the server loses nothing; only a crash of the machine would
		"full_page_writes = off",
		"max_connections = 400",
		"shared_buffers = 256MB",
		"track_functions = 'all'",
		"log_min_messages = warning",
		"log_line_prefix = '%m [%p] %q%u@%d '",
	}, cfg.Settings...)
	conf := filepath.Join(c.dataDir(), "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	_, err = f.WriteString("\n# pgworker test cluster\n" + strings.Join(settings, "\n") + "\n")
	f.Close()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}

	// A port can be taken between choosing it and binding it: try a few.
	for try := 0; ; try++ {
		c.Port, err = testhelp.FreePort()
		if err != nil {
			break
		}
		err = c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-l", c.LogFile(), "-w", "-t", "120",
			"-o", "-p "+strconv.Itoa(c.Port), "start")
		if err == nil || try == 4 {
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

// URL is the superuser URL of database db on the cluster.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// LogFile is the server's log.
func (c *Cluster) LogFile() string { return filepath.Join(c.Dir, "postgres.log") }

func (c *Cluster) dataDir() string { return filepath.Join(c.Dir, "data") }

// Restart restarts the server with the given shutdown mode (smart, fast or
// immediate) on the same port.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	return c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-l", c.LogFile(), "-w", "-t", "120", "-m", mode,
		"-o", "-p "+strconv.Itoa(c.Port), "restart")
}

// Stop stops the server (immediate mode) and keeps its directory.
func (c *Cluster) Stop(ctx context.Context) error {
	return c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-w", "-m", "immediate", "stop")
}

// Start starts a stopped server again on its port.
func (c *Cluster) Start(ctx context.Context) error {
	return c.run(ctx, "pg_ctl", "-D", c.dataDir(), "-l", c.LogFile(), "-w", "-t", "120",
		"-o", "-p "+strconv.Itoa(c.Port), "start")
}

// Destroy stops the server and removes its directory.
func (c *Cluster) Destroy() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.Stop(ctx)
	if _, statErr := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); errors.Is(statErr, os.ErrNotExist) {
		err = nil // already stopped
	}
	return errors.Join(err, os.RemoveAll(c.Dir))
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, name), args...)
	cmd.Dir = c.Dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// BinDir finds the PostgreSQL server binaries: $PG_BINDIR, the directory of
// initdb on PATH, or the newest /usr/lib/postgresql/*/bin (Debian's layout).
func BinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", errors.New("PostgreSQL server binaries not found: install the postgresql package or set PG_BINDIR")
	}
	sort.Slice(matches, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[j]))))
		return vi < vj
	})
	return filepath.Dir(matches[len(matches)-1]), nil
}
