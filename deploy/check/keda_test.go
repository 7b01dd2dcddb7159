package check

import (
	"context"
	"database/sql"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the driver KEDA's postgresql scaler uses
	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func init() {
	// KEDA's validation logs through controller-runtime.
	ctrllog.SetLogger(logr.Discard())
}

// postgresqlParams reads the parameters of KEDA's postgresql scaler from
// the scaler's own source in the module cache: the keda:"name=..., order=..."
// tags of its metadata struct. It returns name to orders (triggerMetadata,
// authParams, resolvedEnv).
func postgresqlParams(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/kedacore/keda/v2").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/kedacore/keda/v2: %v", err)
	}
	file := filepath.Join(strings.TrimSpace(string(out)), "pkg", "scalers", "postgresql_scaler.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatalf("KEDA's postgresql scaler: %v", err)
	}
	params := map[string][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "postgreSQLMetadata" {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			if field.Tag == nil {
				continue
			}
			tag, _ := strconv.Unquote(field.Tag.Value)
			var name string
			var orders []string
			for _, part := range strings.Split(reflect.StructTag(tag).Get("keda"), ",") {
				k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
				switch k {
				case "name":
					name = v
				case "order":
					orders = strings.Split(v, ";")
				}
			}
			if name != "" {
				params[name] = orders
			}
		}
		return false
	})
	if params["query"] == nil || params["connection"] == nil {
		t.Fatalf("%s: no postgreSQLMetadata struct with query and connection parameters: has KEDA moved it?", file)
	}
	return params
}

func hasOrder(orders []string, want string) bool {
	for _, o := range orders {
		if o == want {
			return true
		}
	}
	return false
}

// TestScaledObject checks the ScaledObject and TriggerAuthentication as
// KEDA's admission webhook and its postgresql scaler would read them.
func TestScaledObject(t *testing.T) {
	t.Parallel()
	m := load(t)
	so := m.scaled
	if err := kedav1alpha1.ValidateTriggers(so.Spec.Triggers); err != nil {
		t.Error(err)
	}
	if err := kedav1alpha1.CheckReplicaCountBoundsAreValid(so); err != nil {
		t.Error(err)
	}
	if err := kedav1alpha1.CheckFallbackValid(so); err != nil {
		t.Error(err)
	}
	if _, err := m.auth.ValidateCreate(nil); err != nil {
		t.Errorf("TriggerAuthentication: %v", err)
	}
	ref := so.Spec.ScaleTargetRef
	if ref == nil || ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || ref.Name != m.deployment.Name {
		t.Errorf("scaleTargetRef %+v does not name the Deployment %s", ref, m.deployment.Name)
	}
	if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount != 0 {
		t.Error("minReplicaCount is not 0: an idle fleet should cost nothing (files.scaling_settings.min_nodes keeps nodes if wanted)")
	}

	params := postgresqlParams(t)
	if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "postgresql" {
		t.Fatalf("triggers %+v: want one postgresql trigger", so.Spec.Triggers)
	}
	tr := so.Spec.Triggers[0]
	for k := range tr.Metadata {
		if !hasOrder(params[k], "triggerMetadata") {
			t.Errorf("trigger metadata %q is not a trigger parameter of KEDA's postgresql scaler", k)
		}
	}
	for _, k := range []string{"query", "targetQueryValue", "activationTargetQueryValue"} {
		if tr.Metadata[k] == "" {
			t.Errorf("the trigger sets no %s", k)
		}
	}
	if tr.AuthenticationRef == nil || tr.AuthenticationRef.Name != m.auth.Name || (tr.AuthenticationRef.Kind != "" && tr.AuthenticationRef.Kind != "TriggerAuthentication") {
		t.Fatalf("authenticationRef %+v does not name the TriggerAuthentication %s", tr.AuthenticationRef, m.auth.Name)
	}
	if len(m.auth.Spec.SecretTargetRef) != 1 || m.auth.Spec.SecretTargetRef[0].Parameter != "connection" {
		t.Fatalf("secretTargetRef %+v: want the one parameter connection", m.auth.Spec.SecretTargetRef)
	}
	for _, r := range m.auth.Spec.SecretTargetRef {
		if !hasOrder(params[r.Parameter], "authParams") {
			t.Errorf("parameter %q is not an authentication parameter of KEDA's postgresql scaler", r.Parameter)
		}
		m.secretValue(t, r.Name, r.Key)
	}
}

// scalerConnection is the connection string the TriggerAuthentication hands
// the scaler.
func scalerConnection(t *testing.T, m manifests) string {
	t.Helper()
	r := m.auth.Spec.SecretTargetRef[0]
	return m.secretValue(t, r.Name, r.Key)
}

// TestScalerConnection checks the connection string of the example Secret:
// TLS, a login role of roles.sql, and statements that a transaction pool can
// carry.
func TestScalerConnection(t *testing.T) {
	t.Parallel()
	m := load(t)
	conn := scalerConnection(t, m)
	cfg, err := pgx.ParseConfig(conn)
	if err != nil {
		t.Fatalf("the scaler's connection: %v", err)
	}
	if !strings.Contains(conn, placeholder) {
		t.Errorf("the example connection holds no %s password placeholder", placeholder)
	}
	if cfg.TLSConfig == nil {
		t.Error("the scaler's connection does not ask for TLS (sslmode)")
	}
	// KEDA opens it with database/sql and pgx, which prepare and cache
	// statements unless told otherwise: a transaction pool would hand the
	// next query to a server connection without the statement.
	if mode := cfg.DefaultQueryExecMode; mode != pgx.QueryExecModeExec && mode != pgx.QueryExecModeSimpleProtocol {
		t.Errorf("default_query_exec_mode is %v: through PgBouncer's transaction pool, want exec or simple_protocol", mode)
	}
	if !strings.Contains(read(t, rolesFile), "CREATE ROLE "+cfg.User+" LOGIN") {
		t.Errorf("the scaler logs in as %s, which %s does not create", cfg.User, rolesFile)
	}
}

// TestScalerQuery runs the trigger's query the way KEDA's postgresql scaler
// does (database/sql with the pgx driver, the first column of the first row
// scanned into a float64) on a migrated database, as the role that the
// Secret's connection names, with roles.sql applied. It shows that
// pgworker_reader's grants are enough, that the role can change nothing,
// and how many pods KEDA would ask for.
func TestScalerQuery(t *testing.T) {
	t.Parallel()
	m := load(t)
	tr := m.scaled.Spec.Triggers[0]
	query := tr.Metadata["query"]
	target, err := strconv.ParseFloat(tr.Metadata["targetQueryValue"], 64)
	if err != nil || target <= 0 {
		t.Fatalf("targetQueryValue %q: %v", tr.Metadata["targetQueryValue"], err)
	}
	activation, err := strconv.ParseFloat(tr.Metadata["activationTargetQueryValue"], 64)
	if err != nil {
		t.Fatalf("activationTargetQueryValue %q: %v", tr.Metadata["activationTargetQueryValue"], err)
	}
	cfg, err := pgx.ParseConfig(scalerConnection(t, m))
	if err != nil {
		t.Fatal(err)
	}
	role := cfg.User

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := sql.Open("pgx", newDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Roles are cluster-wide: roles.sql runs in a transaction that is
	// rolled back, and the scaler's role is taken with SET LOCAL ROLE.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, read(t, rolesFile)); err != nil {
		t.Fatalf("%s: %v", rolesFile, err)
	}
	var canLogin, inReader, mayConnect bool
	if err := tx.QueryRowContext(ctx, `SELECT rolcanlogin, pg_has_role(rolname, 'pgworker_reader', 'MEMBER'),
			has_database_privilege(rolname, current_database(), 'CONNECT') FROM pg_roles WHERE rolname = $1`, role).
		Scan(&canLogin, &inReader, &mayConnect); err != nil {
		t.Fatalf("role %s after %s: %v", role, rolesFile, err)
	}
	if !canLogin || !inReader || !mayConnect {
		t.Errorf("role %s: login %v, in pgworker_reader %v, may connect %v; want all three", role, canLogin, inReader, mayConnect)
	}
	for _, r := range []string{"pgworker_worker", "pgworker_admin"} {
		var member bool
		if err := tx.QueryRowContext(ctx, "SELECT pg_has_role($1, $2, 'MEMBER')", role, r).Scan(&member); err != nil || member {
			t.Errorf("role %s is in %s (%v): the scaler needs to read, nothing more", role, r, err)
		}
	}

	savepoint := 0
	// asScaler runs f as the scaler's role, inside a savepoint.
	asScaler := func(f func() error) error {
		savepoint++
		sp := "s" + strconv.Itoa(savepoint)
		if _, err := tx.ExecContext(ctx, "SAVEPOINT "+sp+"; SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		ferr := f()
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+sp+"; RESET ROLE"); err != nil {
			t.Fatal(err)
		}
		return ferr
	}
	// desired is what the scaler reads, and the replicas the HPA would
	// want for it (an AverageValue target: ceil(value / target)).
	desired := func() (value float64, active bool, replicas int) {
		t.Helper()
		err := asScaler(func() error {
			rows, err := tx.QueryContext(ctx, query)
			if err != nil {
				return err
			}
			defer rows.Close()
			types, _ := rows.ColumnTypes()
			if len(types) != 1 || !strings.HasPrefix(types[0].DatabaseTypeName(), "INT") {
				t.Errorf("the query returns columns %v, want one integer", types)
			}
			n := 0
			for rows.Next() {
				n++
				if n == 1 {
					if err := rows.Scan(&value); err != nil {
						return err
					}
				}
			}
			if n != 1 {
				t.Errorf("the query returned %d rows, want 1", n)
			}
			return rows.Err()
		})
		if err != nil {
			t.Fatalf("as %s: %s: %v", role, query, err)
		}
		return value, value > activation, int(math.Ceil(value / target))
	}
	super := func(sql string, args ...any) {
		t.Helper()
		if _, err := tx.ExecContext(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	// An empty queue: zero pods, the scaler inactive.
	if v, active, n := desired(); v != 0 || active || n != 0 {
		t.Errorf("empty queue: value %v, active %v, %d pods; want 0, false, 0", v, active, n)
	}
	// Rows and no worker yet: one pod, to measure how long rows take.
	super("INSERT INTO files.files (source) SELECT 'in/' || i FROM generate_series(1, 50) i")
	if v, active, n := desired(); v != 1 || !active || n != 1 {
		t.Errorf("50 pending rows, no worker: value %v, active %v, %d pods; want 1, true, 1", v, active, n)
	}
	// The database's settings bound it: min_nodes and max_nodes.
	super("UPDATE files.scaling_settings SET min_nodes = 3, max_nodes = 8")
	if v, _, n := desired(); v != 3 || n != 3 {
		t.Errorf("min_nodes 3: value %v, %d pods; want 3", v, n)
	}
	if max := int(*m.scaled.Spec.MaxReplicaCount); max < 8 {
		t.Logf("maxReplicaCount %d caps what the hint asks for (max_nodes 20 by default)", max)
	}
	super("UPDATE files.scaling_settings SET min_nodes = 0, max_nodes = 20")
	// Paused: nothing outstanding, back to zero.
	super("SELECT files.pause_queue('default')")
	if v, active, _ := desired(); v != 0 || active {
		t.Errorf("paused queue: value %v, active %v; want 0, false", v, active)
	}

	// The role reads and changes nothing.
	const denied = "42501"
	for _, stmt := range []string{
		"SELECT * FROM files.claim('keda:1:0')",
		"INSERT INTO files.files (source) VALUES ('x')",
		"UPDATE files.scaling_settings SET max_nodes = 100",
		"SELECT files.resume_queue('default')",
	} {
		err := asScaler(func() error { _, err := tx.ExecContext(ctx, stmt); return err })
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != denied {
			t.Errorf("as %s: %s: %v, want SQLSTATE %s", role, stmt, err, denied)
		}
	}
}

// TestWorkVolume checks why the work volume is a memory emptyDir: pgworker
// run refuses a work directory below a directory that others may write
// unless it is sticky. The kubelet creates a disk emptyDir 0777 and a memory one
// (tmpfs) 1777; fsGroup adds the setgid bit.
func TestWorkVolume(t *testing.T) {
	t.Parallel()
	m := load(t)
	c := m.container(t)
	work := setting(t, c, runHelp(t), "work-dir")
	vol := mountFor(t, m, c, work)
	if vol == nil || vol.EmptyDir == nil {
		t.Fatalf("the work directory %s is on no emptyDir", work)
	}
	var mountPath string
	for _, vm := range c.VolumeMounts {
		if vm.Name == vol.Name {
			mountPath = vm.MountPath
		}
	}
	rel, err := filepath.Rel(mountPath, work)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		t.Fatalf("the work directory %s is not below the volume's mount %s: pgworker wants a directory of its own user", work, mountPath)
	}
	for _, c := range []struct {
		name string
		mode os.FileMode
		ok   bool
	}{
		{"disk emptyDir", 0o777 | os.ModeSetgid, false},
		{"memory emptyDir", 0o777 | os.ModeSetgid | os.ModeSticky, true},
	} {
		mount := filepath.Join(t.TempDir(), "volume")
		if err := os.Mkdir(mount, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(mount, c.mode); err != nil {
			t.Fatal(err)
		}
		// pgworker run checks the work directory before it connects: a
		// database nobody listens on tells the two apart.
		cmd := exec.Command(pgworkerBin, "run", "--exec", "/bin/true", "--work-dir", filepath.Join(mount, rel))
		cmd.Env = append(os.Environ(), "PGWORKER_DATABASE_URL=postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
		out, _ := cmd.CombinedOutput()
		refused := strings.Contains(string(out), "--work-dir")
		if refused == c.ok || !strings.Contains(string(out), "database") && c.ok {
			t.Errorf("%s (mode %v): pgworker run says %s", c.name, c.mode, out)
		}
	}
	if vol.EmptyDir.Medium != "Memory" {
		t.Errorf("the work volume's medium is %q: pgworker would refuse the disk emptyDir (see above)", vol.EmptyDir.Medium)
	}
	if vol.EmptyDir.SizeLimit == nil {
		t.Error("the memory work volume has no sizeLimit")
	} else if lim := c.Resources.Limits.Memory(); lim.IsZero() || lim.Cmp(*vol.EmptyDir.SizeLimit) <= 0 {
		t.Errorf("the memory limit %v does not exceed the work volume's sizeLimit %v: tmpfs pages count as the container's memory", lim, vol.EmptyDir.SizeLimit)
	}
}
