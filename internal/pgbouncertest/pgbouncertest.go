// Package pgbouncertest runs a real PgBouncer in front of a test's PostgreSQL
// server: on 127.0.0.1 and a free port, with its configuration, auth file
// and log in a temporary directory, stopped when the test ends.
//
//	b := pgbouncertest.Start(t, pgtest.ServerURL(t), nil) // transaction pool
//	cfg, _ := pgx.ParseConfig(b.URL("mydb"))
//	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
//
// Fault tests Kill, Stop, Start or Restart it, or Pause and Resume it
// through its admin console. StartINI runs a configuration of the test's own,
// such as a shipped pgbouncer.ini with its paths and port rewritten.
//
// The binary is pgbouncer on PATH, else /usr/sbin/pgbouncer. When running as
// root, PgBouncer (which refuses root) runs as the postgres OS user.
package pgbouncertest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/testhelp"
)

// DefaultBinary is where Debian's pgbouncer package installs PgBouncer.
const DefaultBinary = "/usr/sbin/pgbouncer"

// Config configures Start. A nil Config works.
type Config struct {
	// PoolMode is the pool_mode: "transaction", "session" or "statement".
	// Defaults to "transaction".
	PoolMode string
	// AuthType is the auth_type, such as "md5" or "scram-sha-256".
	// Defaults to "trust" (a user must still be in the auth file: in Users,
	// or the server URL's user).
	AuthType string
	// Users are the auth file's entries: user name to password, given in
	// plain text or as an "md5..." or "SCRAM-SHA-256$..." secret. The server
	// URL's user is always added, with the URL's password, unless listed.
	Users map[string]string
	// Settings are further [pgbouncer] settings, such as
	// {"max_client_conn": "50"}; they override the defaults Start writes.
	Settings map[string]string
	// Binary is the pgbouncer program. Defaults to pgbouncer on PATH, else
	// DefaultBinary.
	Binary string
	// StartTimeout bounds the wait for PgBouncer to start. Defaults to 15s.
	StartTimeout time.Duration
}

// Bouncer is a PgBouncer process (running, or stopped by Stop or Kill).
type Bouncer struct {
	// Dir is the temporary directory holding pgbouncer.ini and the auth
	// file; removed at the end of the test. PgBouncer's log is kept in
	// memory (LogTail) and printed when the test fails.
	Dir string
	// Port is the port PgBouncer listens on, on 127.0.0.1. It stays the same
	// across Stop and Start.
	Port int
	// Version is PgBouncer's version, such as "1.18.0".
	Version string

	bin       string
	ini       string // path of the configuration file
	server    *url.URL
	adminUser string
	adminPass string
	timeout   time.Duration
	cred      *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	log  *lockedBuffer // output of every run, for error messages
}

// Start starts PgBouncer in front of the server of serverURL (a
// postgres:// URL), forwarding every database name ("* =" entry) to that
// server, and waits until it accepts connections. It fails the test when
// PgBouncer cannot start, and stops it when the test ends.
func Start(t testing.TB, serverURL string, cfg *Config) *Bouncer {
	t.Helper()
	if cfg == nil {
		cfg = &Config{}
	}
	server, err := url.Parse(serverURL)
	if err != nil {
		t.Fatalf("pgbouncertest: parse server URL: %v", err)
	}
	host, port := server.Hostname(), server.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "5432"
	}
	users := map[string]string{}
	for u, p := range cfg.Users {
		users[u] = p
	}
	adminUser := server.User.Username()
	if adminUser == "" {
		t.Fatal("pgbouncertest: the server URL names no user")
	}
	adminPass, _ := server.User.Password()
	if _, ok := users[adminUser]; !ok {
		users[adminUser] = adminPass
	} else {
		adminPass = users[adminUser]
	}

	b := StartINI(t, cfg, func(dir string, listenPort int) (string, error) {
		authFile := filepath.Join(dir, "users.txt")
		if err := os.WriteFile(authFile, authFileText(users), 0o600); err != nil {
			return "", err
		}
		settings := map[string]string{
			"listen_addr":               "127.0.0.1",
			"listen_port":               strconv.Itoa(listenPort),
			"unix_socket_dir":           "",
			"auth_type":                 or(cfg.AuthType, "trust"),
			"auth_file":                 authFile,
			"pool_mode":                 or(cfg.PoolMode, "transaction"),
			"admin_users":               adminUser,
			"max_client_conn":           "500",
			"default_pool_size":         "20",
			"ignore_startup_parameters": "extra_float_digits",
			"server_login_retry":        "1",
		}
		for k, v := range cfg.Settings {
			settings[k] = v
		}
		var ini strings.Builder
		fmt.Fprintf(&ini, "[databases]\n* = host=%s port=%s\n\n[pgbouncer]\n", host, port)
		keys := make([]string, 0, len(settings))
		for k := range settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&ini, "%s = %s\n", k, settings[k])
		}
		return ini.String(), nil
	})
	b.server = server
	b.adminUser, b.adminPass = adminUser, adminPass
	return b
}

// StartINI starts PgBouncer with the configuration that ini returns, such
// as a shipped pgbouncer.ini with its port and paths rewritten. ini gets the
// temporary directory (for the auth file and whatever else the
// configuration names; PgBouncer may read it) and the port to listen on, on
// 127.0.0.1. The configuration should log to stderr (no logfile). Of cfg,
// which may be nil, only Binary and StartTimeout apply. URL and Admin need a
// Bouncer from Start; Addr works on both.
func StartINI(t testing.TB, cfg *Config, ini func(dir string, port int) (string, error)) *Bouncer {
	t.Helper()
	if cfg == nil {
		cfg = &Config{}
	}
	b, err := newBouncer(cfg.Binary, cfg.StartTimeout)
	if err != nil {
		t.Fatalf("pgbouncertest: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("pgbouncertest: stop: %v", err)
		}
		if t.Failed() {
			t.Logf("pgbouncer output:\n%s", b.LogTail(60))
		}
		os.RemoveAll(b.Dir)
	})
	text, err := ini(b.Dir, b.Port)
	if err != nil {
		t.Fatalf("pgbouncertest: write configuration: %v", err)
	}
	if err := b.writeINI(text); err != nil {
		t.Fatalf("pgbouncertest: %v", err)
	}
	if err := b.Start(); err != nil {
		t.Fatalf("pgbouncertest: %v", err)
	}
	return b
}

// newBouncer finds the binary and prepares the directory and port.
func newBouncer(binary string, timeout time.Duration) (*Bouncer, error) {
	bin, err := findBinary(binary)
	if err != nil {
		return nil, err
	}
	version, err := binaryVersion(bin)
	if err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	// Not t.TempDir: its parent is private to this user, and PgBouncer may
	// run as another.
	dir, err := os.MkdirTemp("", "pgbouncertest-")
	if err != nil {
		return nil, err
	}
	b := &Bouncer{Dir: dir, Version: version, bin: bin, ini: filepath.Join(dir, "pgbouncer.ini"), timeout: timeout, log: &lockedBuffer{}}
	if os.Geteuid() == 0 {
		if b.cred, err = postgresUser(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if b.Port, err = testhelp.FreePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

func findBinary(binary string) (string, error) {
	if binary != "" {
		if _, err := os.Stat(binary); err != nil {
			return "", fmt.Errorf("pgbouncer binary %s: %w (install pgbouncer (apt-get install pgbouncer))", binary, err)
		}
		return binary, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat(DefaultBinary); err == nil {
		return DefaultBinary, nil
	}
	return "", errors.New("pgbouncer not found on PATH nor at " + DefaultBinary + ": install pgbouncer (apt-get install pgbouncer)")
}

var versionRE = regexp.MustCompile(`(?m)^PgBouncer (\d+\.\d+(?:\.\d+)?)`)

func binaryVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", bin, err, out)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version: unexpected output %q", bin, out)
	}
	return string(m[1]), nil
}

// atLeast reports whether the version is major.minor or later.
func (b *Bouncer) atLeast(major, minor int) bool {
	parts := strings.Split(b.Version, ".")
	maj, _ := strconv.Atoi(parts[0])
	mnr := 0
	if len(parts) > 1 {
		mnr, _ = strconv.Atoi(parts[1])
	}
	return maj > major || maj == major && mnr >= minor
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PgBouncer refuses to run as root, and there is no postgres OS user to run it as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (b *Bouncer) writeINI(text string) error {
	if err := os.WriteFile(b.ini, []byte(text), 0o600); err != nil {
		return err
	}
	if b.cred == nil {
		return nil
	}
	// Everything in the directory belongs to the user PgBouncer runs as.
	return filepath.WalkDir(b.Dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(b.cred.Uid), int(b.cred.Gid))
	})
}

// Start starts PgBouncer (again) and waits until it accepts connections.
func (b *Bouncer) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		return errors.New("pgbouncer is already running")
	}
	cmd := exec.Command(b.bin, b.ini)
	cmd.Dir = b.Dir
	if b.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", b.bin, err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		pw.Close()
		close(done)
	}()

	// PgBouncer logs "process up" once it listens: wait for that line, or
	// for the process to end.
	up, drained := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			b.log.WriteLine(line)
			if !signalled && strings.Contains(line, "process up") {
				signalled = true
				close(up)
			}
		}
		io.Copy(io.Discard, pr)
	}()
	timer := time.NewTimer(b.timeout)
	defer timer.Stop()
	select {
	case <-up:
	case <-done:
		<-drained // the last lines are in the log before it is quoted
		return fmt.Errorf("pgbouncer exited at start (%v):\n%s", waitErr, b.LogTail(30))
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-done
		<-drained
		return fmt.Errorf("pgbouncer did not start within %s:\n%s", b.timeout, b.LogTail(30))
	}
	b.cmd, b.done = cmd, done
	return nil
}

// Stop shuts PgBouncer down at once, closing every connection, as an
// administrator's "SHUTDOWN" does. It waits for the process to end; it is a
// no-op when PgBouncer is not running.
func (b *Bouncer) Stop() error {
	// Immediate shutdown is SIGTERM up to 1.22 and SIGQUIT from 1.23, where
	// SIGTERM waits for the clients to leave.
	sig := syscall.SIGTERM
	if b.atLeast(1, 23) {
		sig = syscall.SIGQUIT
	}
	return b.halt(sig, 10*time.Second)
}

// Kill kills PgBouncer (SIGKILL), as a crash would: clients see their
// connections break, and new ones are refused until Start.
func (b *Bouncer) Kill() error { return b.halt(syscall.SIGKILL, 0) }

func (b *Bouncer) halt(sig syscall.Signal, grace time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return nil
	}
	if err := b.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	if grace > 0 {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-b.done:
		case <-t.C:
			_ = b.cmd.Process.Kill()
		}
	}
	<-b.done
	b.cmd, b.done = nil, nil
	return nil
}

// Restart stops PgBouncer at once and starts it again on the same port.
func (b *Bouncer) Restart() error {
	if err := b.Stop(); err != nil {
		return err
	}
	return b.Start()
}

// Running reports whether the PgBouncer process is running.
func (b *Bouncer) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd != nil
}

// Addr is "127.0.0.1:PORT".
func (b *Bouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)) }

// URL returns the server URL given to Start, with its host and port
// replaced by PgBouncer's and its database by dbname. User, password and
// parameters stay.
func (b *Bouncer) URL(dbname string) string {
	if b.server == nil {
		panic("pgbouncertest: URL needs a Bouncer from Start")
	}
	u := *b.server
	u.Host = b.Addr()
	u.Path = "/" + dbname
	u.RawPath = ""
	return u.String()
}

// Admin runs a command on PgBouncer's admin console (database "pgbouncer")
// as the server URL's user (an admin_users entry), with its password from
// Config.Users, given there in plain text, or else from the URL. It returns
// the rows the console answers, each column by name. Commands: SHOW POOLS,
// SHOW DATABASES, SHOW CONFIG, PAUSE, RESUME, RELOAD...
func (b *Bouncer) Admin(ctx context.Context, command string) ([]map[string]string, error) {
	if b.server == nil {
		return nil, errors.New("pgbouncertest: Admin needs a Bouncer from Start")
	}
	u := *b.server
	u.Host, u.Path, u.RawPath = b.Addr(), "/pgbouncer", ""
	u.User = url.UserPassword(b.adminUser, b.adminPass)
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		return nil, err
	}
	// The console speaks only the simple query protocol.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to the pgbouncer console: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, command)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer console %q: %w", command, err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		fields := rows.FieldDescriptions()
		raw := rows.RawValues()
		row := make(map[string]string, len(fields))
		for i, f := range fields {
			row[f.Name] = string(raw[i])
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgbouncer console %q: %w", command, err)
	}
	return out, nil
}

// Pause makes PgBouncer hold new queries until Resume, once the running
// transactions have finished (its PAUSE command).
func (b *Bouncer) Pause(ctx context.Context) error {
	_, err := b.Admin(ctx, "PAUSE")
	return err
}

// Resume ends a Pause.
func (b *Bouncer) Resume(ctx context.Context) error {
	_, err := b.Admin(ctx, "RESUME")
	return err
}

// LogTail returns the last n lines PgBouncer printed, over all its runs.
func (b *Bouncer) LogTail(n int) string { return b.log.Tail(n) }

func authFileText(users map[string]string) []byte {
	names := make([]string, 0, len(users))
	for u := range users {
		names = append(names, u)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	for _, u := range names {
		fmt.Fprintf(&buf, "%s %s\n", quote(u), quote(users[u]))
	}
	return buf.Bytes()
}

// quote writes s as an auth file field: in double quotes, with a double
// quote doubled.
func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// lockedBuffer keeps PgBouncer's output lines.
type lockedBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (l *lockedBuffer) WriteLine(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

func (l *lockedBuffer) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := max(len(l.lines)-n, 0)
	return strings.Join(l.lines[from:], "\n")
}
