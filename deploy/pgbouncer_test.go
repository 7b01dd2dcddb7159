package deploy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgworker/pgworker/internal/pgbouncertest"
	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/internal/testhelp"
)

// writeTLS writes a throwaway key and self-signed certificate for 127.0.0.1.
func writeTLS(dir string) (keyFile, certFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "pgbouncer.example.internal"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	keyFile, certFile = filepath.Join(dir, "pgbouncer.key"), filepath.Join(dir, "pgbouncer.crt")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", err
	}
	return keyFile, certFile, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// rewriteINI returns the shipped configuration with the [pgbouncer]
// settings of set replaced (each must be there) and every [databases]
// entry pointed at host, port and dbname. Everything else stays as shipped.
func rewriteINI(text string, set map[string]string, host string, port uint16, dbname string) (string, error) {
	lines := strings.Split(text, "\n")
	section := ""
	done := map[string]bool{}
	kv := regexp.MustCompile(`^(\w+)\s*=\s*(.*)$`)
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "[") {
			section = strings.Trim(trimmed, "[]")
			continue
		}
		m := kv.FindStringSubmatch(trimmed)
		if m == nil {
			continue
		}
		switch section {
		case "pgbouncer":
			if v, ok := set[m[1]]; ok {
				lines[i] = m[1] + " = " + v
				done[m[1]] = true
			}
		case "databases":
			params := strings.Fields(m[2])
			seen := 0
			for j, p := range params {
				k, _, _ := strings.Cut(p, "=")
				switch k {
				case "host":
					params[j], seen = "host="+host, seen+1
				case "port":
					params[j], seen = "port="+strconv.Itoa(int(port)), seen+1
				case "dbname":
					params[j], seen = "dbname="+dbname, seen+1
				}
			}
			if seen != 3 {
				return "", fmt.Errorf("database entry %s does not name host, port and dbname", m[1])
			}
			lines[i] = m[1] + " = " + strings.Join(params, " ")
		}
	}
	for k := range set {
		if !done[k] {
			return "", fmt.Errorf("the shipped [pgbouncer] section has no %s to rewrite", k)
		}
	}
	return strings.Join(lines, "\n"), nil
}

// replaceLine replaces the userlist line of user, which must be there.
func replaceLine(text, user, secret string, as string) (string, error) {
	re := regexp.MustCompile(`(?m)^"` + regexp.QuoteMeta(user) + `" "[^"]*"$`)
	if !re.MatchString(text) {
		return "", fmt.Errorf("%s has no line for %q", userlistFile, user)
	}
	return re.ReplaceAllLiteralString(text, fmt.Sprintf("%q %q", as, secret)), nil
}

// TestPgBouncerShippedConfig runs PgBouncer with the shipped pgbouncer.ini
// and userlist (ports, paths and the server rewritten, the placeholder
// secrets replaced) in front of a migrated database, and uses it as a
// worker node would.
func TestPgBouncerShippedConfig(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL := pgtest.URL(t)
	dbCfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	super, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(context.Background())

	// A worker login with a SCRAM password, as docs/deploy.md sets up.
	role := "pgworker_node_" + testhelp.RandomHex(4)
	password := testhelp.RandomHex(12)
	if _, err := super.Exec(ctx, "SET password_encryption = 'scram-sha-256'"); err != nil {
		t.Fatal(err)
	}
	if _, err := super.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s' IN ROLE pgworker_worker", role, password)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), pgtest.ServerURL(t))
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	var verifier string
	if err := super.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&verifier); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(verifier, "SCRAM-SHA-256$") {
		t.Fatalf("the server stored %.14q..., not a SCRAM verifier", verifier)
	}

	shipped := read(t, pgbouncerFile)
	userlist := read(t, userlistFile)
	b := pgbouncertest.StartINI(t, nil, func(dir string, port int) (string, error) {
		keyFile, certFile, err := writeTLS(dir)
		if err != nil {
			return "", err
		}
		// The worker's line gets the test role, the console's the same
		// password; the other placeholder lines stay as shipped.
		ul, err := replaceLine(userlist, "pgworker_node", verifier, role)
		if err != nil {
			return "", err
		}
		if ul, err = replaceLine(ul, "pgbouncer_admin", verifier, "pgbouncer_admin"); err != nil {
			return "", err
		}
		authFile := filepath.Join(dir, "userlist.txt")
		if err := os.WriteFile(authFile, []byte(ul), 0o600); err != nil {
			return "", err
		}
		return rewriteINI(shipped, map[string]string{
			"listen_addr":          "127.0.0.1",
			"listen_port":          strconv.Itoa(port),
			"unix_socket_dir":      dir,
			"pidfile":              filepath.Join(dir, "pgbouncer.pid"),
			"logfile":              "",
			"auth_file":            authFile,
			"client_tls_key_file":  keyFile,
			"client_tls_cert_file": certFile,
		}, dbCfg.Host, dbCfg.Port, dbCfg.Database)
	})

	pgb := parseINI(t, shipped)
	txDB, listenDB := "", ""
	for name, v := range pgb["databases"] {
		switch connParams(v)["pool_mode"] {
		case "transaction":
			txDB = name
		case "session":
			listenDB = name
		}
	}
	if txDB == "" || listenDB == "" {
		t.Fatalf("pgbouncer.ini needs a transaction pool entry and a session pool entry: %v", pgb["databases"])
	}
	through := func(db, user, pass, sslmode string) *pgx.ConnConfig {
		u := url.URL{Scheme: "postgres", User: url.UserPassword(user, pass), Host: b.Addr(), Path: "/" + db,
			RawQuery: "sslmode=" + sslmode}
		cfg, err := pgx.ParseConfig(u.String())
		if err != nil {
			t.Fatal(err)
		}
		// --statement-mode exec, as the env file sets.
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		return cfg
	}

	t.Run("worker API through the transaction pool", func(t *testing.T) {
		var id int64
		if err := super.QueryRow(ctx, "INSERT INTO files.files (source) VALUES ('in/1.txt') RETURNING id").Scan(&id); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.ConnectConfig(ctx, through(txDB, role, password, "require"))
		if err != nil {
			t.Fatalf("connect to %s as a worker: %v", txDB, err)
		}
		defer conn.Close(context.Background())
		worker := "node1:1:0"
		var got int64
		var attempt int
		var token string
		if err := conn.QueryRow(ctx, "SELECT id, attempt, claim_token FROM files.claim($1)", worker).Scan(&got, &attempt, &token); err != nil {
			t.Fatalf("files.claim through %s: %v", txDB, err)
		}
		if got != id {
			t.Fatalf("claimed row %d, want %d", got, id)
		}
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT files.complete($1, $2, $3, $4, $5)", got, worker, attempt, token, `{"pages": 1}`).Scan(&ok); err != nil || !ok {
			t.Fatalf("files.complete through %s: %v, %v", txDB, ok, err)
		}
		var state string
		if err := super.QueryRow(ctx, "SELECT state FROM files.files WHERE id = $1", id).Scan(&state); err != nil || state != "done" {
			t.Fatalf("row state %q (%v), want done", state, err)
		}
	})

	t.Run("LISTEN through the session pool", func(t *testing.T) {
		conn, err := pgx.ConnectConfig(ctx, through(listenDB, role, password, "require"))
		if err != nil {
			t.Fatalf("connect to %s: %v", listenDB, err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "LISTEN files_pending"); err != nil {
			t.Fatal(err)
		}
		if _, err := super.Exec(ctx, "INSERT INTO files.files (queue, source) VALUES ('scans', 'in/2.txt')"); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no files_pending notification through %s: %v", listenDB, err)
		}
		if n.Payload != "scans" {
			t.Fatalf("notification payload %q, want the queue name scans", n.Payload)
		}
	})

	t.Run("authentication", func(t *testing.T) {
		for _, c := range []struct {
			name          string
			pass, sslmode string
		}{
			{"wrong password", "wrong", "require"},
			{"without TLS", password, "disable"},
		} {
			conn, err := pgx.ConnectConfig(ctx, through(txDB, role, c.pass, c.sslmode))
			if err == nil {
				conn.Close(context.Background())
				t.Errorf("%s: connected", c.name)
				continue
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				t.Errorf("%s: %v, want a refusal from PgBouncer", c.name, err)
			}
		}
	})

	t.Run("console", func(t *testing.T) {
		cfg := through("pgbouncer", "pgbouncer_admin", password, "require")
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("connect to the console as pgbouncer_admin: %v", err)
		}
		defer conn.Close(context.Background())
		rows, err := conn.Query(ctx, "SHOW DATABASES")
		if err != nil {
			t.Fatal(err)
		}
		modes := map[string]string{}
		for rows.Next() {
			vals := rows.RawValues()
			row := map[string]string{}
			for i, f := range rows.FieldDescriptions() {
				row[f.Name] = string(vals[i])
			}
			modes[row["name"]] = row["pool_mode"]
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if modes[txDB] != "transaction" || modes[listenDB] != "session" {
			t.Fatalf("PgBouncer runs %s as %q and %s as %q", txDB, modes[txDB], listenDB, modes[listenDB])
		}
	})
}

// TestPgBouncerConfigContents checks what the test above cannot see: the
// settings that matter in production.
func TestPgBouncerConfigContents(t *testing.T) {
	t.Parallel()
	pgb := parseINI(t, read(t, pgbouncerFile))
	s := pgb["pgbouncer"]
	want := map[string]string{
		"auth_type":           "scram-sha-256",
		"pool_mode":           "transaction",
		"server_reset_query":  "DISCARD ALL",
		"client_idle_timeout": "0",
		"tcp_keepalive":       "1",
	}
	for k, v := range want {
		if s[k] != v {
			t.Errorf("%s = %q, want %q", k, s[k], v)
		}
	}
	if _, ok := s["max_prepared_statements"]; ok {
		t.Error("max_prepared_statements makes PgBouncer before 1.21 (Debian 12's 1.18) refuse to start: leave it commented out")
	}
	for name, v := range pgb["databases"] {
		host := connParams(v)["host"]
		if !strings.HasSuffix(host, "."+exampleDomain) {
			t.Errorf("database %s: host %q is not an %s placeholder", name, host, exampleDomain)
		}
	}
	listenPool, _ := strconv.Atoi(connParams(pgb["databases"]["pgworker_listen"])["pool_size"])
	if listenPool < 20 {
		t.Errorf("pgworker_listen pool_size %d: a session pool needs a server connection per pgworker process (20 nodes and more)", listenPool)
	}
	maxClients, _ := strconv.Atoi(s["max_client_conn"])
	if maxClients < 20*(16+4)+20 {
		t.Errorf("max_client_conn %d is below 20 nodes x (16 slots + 4) + 20 LISTEN clients", maxClients)
	}
	for _, line := range strings.Split(read(t, userlistFile), "\n") {
		if strings.HasPrefix(line, `"`) && !strings.Contains(line, placeholder) {
			t.Errorf("%s: a line without the %s placeholder: %q", userlistFile, placeholder, line)
		}
	}
}
