package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// TestRolesSQL runs roles.sql on a migrated database inside a transaction
// that is rolled back (roles are cluster-wide), and checks what each login
// may do.
func TestRolesSQL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, read(t, rolesFile)); err != nil {
		t.Fatalf("%s: %v", rolesFile, err)
	}

	// as runs sql as role; wantErr is "" or the SQLSTATE expected.
	savepoint := 0
	as := func(role, sql, wantErr string) {
		t.Helper()
		savepoint++
		sp := fmt.Sprintf("s%d", savepoint)
		if _, err := tx.Exec(ctx, "SAVEPOINT "+sp); err != nil {
			t.Fatal(err)
		}
		_, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL ROLE %s; %s", role, sql))
		var pgErr *pgconn.PgError
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("as %s: %s: %v", role, sql, err)
		case wantErr != "" && (!errors.As(err, &pgErr) || pgErr.Code != wantErr):
			t.Errorf("as %s: %s: %v, want SQLSTATE %s", role, sql, err, wantErr)
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sp+"; RESET ROLE"); err != nil {
			t.Fatal(err)
		}
	}
	const denied = "42501"
	as("pgworker_node", "SELECT * FROM files.claim('node1:1:0')", "")
	as("pgworker_node", "SELECT files.register_worker('node1:1:1', key => 'roles-test-key-0123')", "")
	as("pgworker_node", "SELECT files.heartbeat('roles-test-key-0123', 'node1:1:1')", "")
	as("pgworker_node", "SELECT * FROM files.active_workers", "")
	as("pgworker_node", "INSERT INTO files.files (source) VALUES ('x')", denied)
	as("pgworker_node", "UPDATE files.files SET state = 'done'", denied)
	as("pgworker_node", "SELECT files.pause_queue('default')", denied)
	as("pgworker_ops", "INSERT INTO files.files (source) VALUES ('x')", "")
	as("pgworker_ops", "SELECT files.pause_queue('default')", "")
	as("pgworker_ops", "SELECT * FROM files.queue_stats", "")
	as("pgworker_dashboard", "SELECT * FROM files.queue_stats", "")
	as("pgworker_dashboard", "SELECT count(*) FROM files.files", "")
	as("pgworker_dashboard", "SELECT * FROM files.claim('node1:1:0')", denied)
	as("pgworker_dashboard", "INSERT INTO files.files (source) VALUES ('x')", denied)

	var logins []string
	rows, err := tx.Query(ctx, `SELECT rolname || ':' || rolcanlogin FROM pg_roles
		WHERE rolname IN ('pgworker_node', 'pgworker_ops', 'pgworker_dashboard', 'pgbouncer_admin', 'pgbouncer_stats')
		ORDER BY rolname`)
	if err != nil {
		t.Fatal(err)
	}
	if logins, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	want := "pgbouncer_admin:false pgbouncer_stats:false pgworker_dashboard:true pgworker_node:true pgworker_ops:true"
	if got := strings.Join(logins, " "); got != want {
		t.Errorf("roles %s, want %s", got, want)
	}
	var publicConnect bool
	if err := tx.QueryRow(ctx, "SELECT has_database_privilege('public', current_database(), 'CONNECT')").Scan(&publicConnect); err != nil {
		t.Fatal(err)
	}
	if publicConnect {
		t.Error("PUBLIC may still connect to the queue database")
	}
	for _, r := range []string{"pgworker_node", "pgworker_ops", "pgworker_dashboard"} {
		var ok bool
		if err := tx.QueryRow(ctx, "SELECT has_database_privilege($1, current_database(), 'CONNECT')", r).Scan(&ok); err != nil || !ok {
			t.Errorf("%s may not connect to the queue database (%v)", r, err)
		}
	}
}

// TestRolesInDocs checks that docs/deploy.md shows the statements roles.sql runs.
func TestRolesInDocs(t *testing.T) {
	t.Parallel()
	docs := read(t, docsFile)
	for _, stmt := range regexp.MustCompile(`(?m)^CREATE ROLE [^;]*;`).FindAllString(read(t, rolesFile), -1) {
		if !strings.Contains(docs, stmt) {
			t.Errorf("%s does not show %q from %s", docsFile, stmt, rolesFile)
		}
	}
}
