package pgbouncertest

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/pgworker/pgworker/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func connectExec(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	// What pgworker --statement-mode exec does: no named prepared
	// statements, which a transaction pool cannot keep.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through pgbouncer: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func dbName(t *testing.T, server string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(server)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

func setting(t *testing.T, ctx context.Context, b *Bouncer, key string) string {
	t.Helper()
	rows, err := b.Admin(ctx, "SHOW CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r["key"] == key {
			return r["value"]
		}
	}
	t.Fatalf("SHOW CONFIG has no %s", key)
	return ""
}

func TestTransactionPoolExecMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := pgtest.ServerURL(t)
	b := Start(t, server, nil)
	if got := setting(t, ctx, b, "pool_mode"); got != "transaction" {
		t.Fatalf("pool_mode = %q, want transaction by default", got)
	}

	conn := connectExec(t, ctx, b.URL(dbName(t, server)))
	for i := range 50 {
		var n int
		if err := conn.QueryRow(ctx, "SELECT $1::int + 1", i).Scan(&n); err != nil {
			t.Fatalf("query %d through the transaction pool: %v", i, err)
		}
		if n != i+1 {
			t.Fatalf("got %d, want %d", n, i+1)
		}
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "CREATE TEMP TABLE t (x int) ON COMMIT DROP")
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO t VALUES ($1)", 7)
		return err
	})
	if err != nil {
		t.Fatalf("transaction through the transaction pool: %v", err)
	}
}

func TestPoolModeAndSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := Start(t, pgtest.ServerURL(t), &Config{PoolMode: "session", Settings: map[string]string{"max_client_conn": "42"}})
	if got := setting(t, ctx, b, "pool_mode"); got != "session" {
		t.Errorf("pool_mode = %q, want session", got)
	}
	if got := setting(t, ctx, b, "max_client_conn"); got != "42" {
		t.Errorf("max_client_conn = %q, want 42", got)
	}
}

func TestSessionPoolListenNotify(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server := pgtest.ServerURL(t)
	b := Start(t, server, &Config{PoolMode: "session"})

	listener := connectExec(t, ctx, b.URL(dbName(t, server)))
	if _, err := listener.Exec(ctx, "LISTEN pgbouncertest"); err != nil {
		t.Fatal(err)
	}
	direct, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	if _, err := direct.Exec(ctx, "SELECT pg_notify('pgbouncertest', 'hello')"); err != nil {
		t.Fatal(err)
	}
	n, err := listener.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("no notification through the session pool: %v", err)
	}
	if n.Channel != "pgbouncertest" || n.Payload != "hello" {
		t.Fatalf("got %s %q, want pgbouncertest \"hello\"", n.Channel, n.Payload)
	}
}

func TestKillAndRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	server := pgtest.ServerURL(t)
	b := Start(t, server, nil)
	url := b.URL(dbName(t, server))
	port := b.Port

	conn := connectExec(t, ctx, url)
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	if b.Running() {
		t.Fatal("Running() after Kill")
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection through a killed pgbouncer still answers")
	}
	if _, err := pgx.Connect(ctx, url); err == nil {
		t.Fatal("connected to a killed pgbouncer")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect to a killed pgbouncer: %v, want connection refused", err)
	}

	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	if b.Port != port {
		t.Fatalf("port changed from %d to %d", port, b.Port)
	}
	if _, err := connectExec(t, ctx, url).Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("after Start: %v", err)
	}

	before := connectExec(t, ctx, url)
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := before.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection survived Restart")
	}
	if _, err := connectExec(t, ctx, url).Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("after Restart: %v", err)
	}
	if err := b.Start(); err == nil {
		t.Fatal("Start of a running pgbouncer succeeded")
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	server := pgtest.ServerURL(t)
	db := dbName(t, server)
	b := Start(t, server, nil)
	conn := connectExec(t, ctx, b.URL(db))
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	if err := b.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	result := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "SELECT 2")
		result <- err
	}()
	// The query must wait in PgBouncer: watch it appear as a waiting client.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for waiting := false; !waiting; {
		select {
		case err := <-result:
			t.Fatalf("query answered while paused (err %v)", err)
		case <-ctx.Done():
			t.Fatal("the query never showed up as a waiting client")
		case <-tick.C:
		}
		pools, err := b.Admin(ctx, "SHOW POOLS")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pools {
			if p["database"] == db && p["cl_waiting"] != "0" {
				waiting = true
			}
		}
	}
	if err := b.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-result; err != nil {
		t.Fatalf("query after Resume: %v", err)
	}
}

func TestSCRAMAuth(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server := pgtest.ServerURL(t)
	cfg, err := pgx.ParseConfig(server)
	if err != nil {
		t.Fatal(err)
	}
	b := Start(t, server, &Config{AuthType: "scram-sha-256", Users: map[string]string{cfg.User: "s3cret pass"}})

	good, err := pgx.ParseConfig(b.URL(cfg.Database))
	if err != nil {
		t.Fatal(err)
	}
	good.Password = "s3cret pass"
	conn, err := pgx.ConnectConfig(ctx, good)
	if err != nil {
		t.Fatalf("connect with the right password: %v", err)
	}
	conn.Close(ctx)

	bad := good.Copy()
	bad.Password = "wrong"
	_, err = pgx.ConnectConfig(ctx, bad)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "08P01" && pgErr.Code != "28P01" {
		t.Fatalf("connect with a wrong password: %v, want an authentication error", err)
	}
	// The console accepts the same credentials.
	if got := setting(t, ctx, b, "auth_type"); got != "scram-sha-256" {
		t.Fatalf("auth_type = %q", got)
	}
}

func TestStartINI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server := pgtest.ServerURL(t)
	cfg, err := pgx.ParseConfig(server)
	if err != nil {
		t.Fatal(err)
	}
	b := StartINI(t, nil, func(dir string, port int) (string, error) {
		if err := os.WriteFile(dir+"/users.txt", []byte(`"`+cfg.User+`" ""`+"\n"), 0o600); err != nil {
			return "", err
		}
		return "[databases]\nalias = host=" + cfg.Host + " port=" + strconv.Itoa(int(cfg.Port)) + " dbname=" + cfg.Database + "\n" +
			"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = " + strconv.Itoa(port) + "\nunix_socket_dir =\n" +
			"auth_type = trust\nauth_file = " + dir + "/users.txt\n", nil
	})
	c := cfg.Copy()
	c.Host, c.Port, c.Database = "127.0.0.1", uint16(b.Port), "alias"
	c.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, c)
	if err != nil {
		t.Fatalf("connect to %s through the alias: %v", b.Addr(), err)
	}
	defer conn.Close(ctx)
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != cfg.Database {
		t.Fatalf("current_database() = %q, %v; want %q", db, err, cfg.Database)
	}
}

func TestStartFailsClearly(t *testing.T) {
	t.Parallel()
	_, err := newBouncer("/nonexistent/pgbouncer", 0)
	if err == nil || !strings.Contains(err.Error(), "apt-get install pgbouncer") {
		t.Fatalf("missing binary: %v, want a hint to install pgbouncer", err)
	}

	// A configuration PgBouncer rejects: Start reports its complaint.
	b, err := newBouncer("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(b.Dir)
	if err := b.writeINI("[pgbouncer]\nlisten_port = " + strconv.Itoa(b.Port) + "\nno_such_setting = 1\n"); err != nil {
		t.Fatal(err)
	}
	err = b.Start()
	if err == nil {
		b.Stop()
		t.Fatal("pgbouncer started with an unknown setting")
	}
	if !strings.Contains(err.Error(), "no_such_setting") {
		t.Fatalf("error %q does not quote pgbouncer's complaint", err)
	}
	if _, err := net.Dial("tcp", b.Addr()); err == nil {
		t.Fatal("something listens on the failed pgbouncer's port")
	}
}
