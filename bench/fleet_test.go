package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/bench"
	"github.com/pgworker/pgworker/internal/pgbouncertest"
	"github.com/pgworker/pgworker/internal/pgtest"
)

// fleetProcesses is the fleet of TestFleetThroughPgBouncer: 200 pgworker
// run processes' worth of runtimes.
const fleetProcesses = 200

// Two hundred runtimes, each with its pool through one transaction-pooling
// PgBouncer and its LISTEN connection straight to the server, as pgworker
// run --listen-url sets them up: the server holds one connection per
// listener and PgBouncer's pool, an idle fleet sends no claim, and each row
// costs each process one claim query at most. On a server of its own, so
// that its 200 listeners leave the shared one's connections to the other
// tests.
func TestFleetThroughPgBouncer(t *testing.T) {
	if testing.Short() {
		t.Skip("200 runtimes: skipped under -short")
	}
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgtest.StartCluster(ctx, &pgtest.ClusterConfig{Settings: []string{"max_connections = 300"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Destroy(); err != nil {
			t.Error(err)
		}
	})
	direct := cluster.URL("fleet")
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE fleet"); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	if err := pgtest.MigrateUp(ctx, direct); err != nil {
		t.Fatal(err)
	}
	const poolSize = 20
	bouncer := pgbouncertest.Start(t, cluster.URL("postgres"), &pgbouncertest.Config{Settings: map[string]string{
		"max_client_conn": "1000", "default_pool_size": "20",
	}})
	pooled, err := pgxpool.ParseConfig(bouncer.URL("fleet"))
	if err != nil {
		t.Fatal(err)
	}
	pooled.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec

	pool := pgtest.PoolFor(t, direct)
	b, err := bench.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	const rows = 5
	res, err := b.Herd(ctx, &bench.HerdConfig{Processes: fleetProcesses, Slots: 2, Rows: rows, Interval: 50 * time.Millisecond,
		PoolConfig: pooled, Idle: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server connections %d; idle: %+v; claims per process per wake-up %.3f (server), most from one process per row %.2f",
		res.ServerConns, res.IdleFleet, res.ClaimQueriesPerProcessPerWakeup, res.MaxProcessClaimsPerRow)
	// The listeners, PgBouncer's pool and the bench's own few.
	if res.ServerConns < fleetProcesses || res.ServerConns > fleetProcesses+poolSize+5 {
		t.Errorf("the server holds %d connections, want %d listeners and at most %d through PgBouncer", res.ServerConns, fleetProcesses, poolSize)
	}
	if res.IdleFleet == nil || res.IdleFleet.ClaimCalls != 0 {
		t.Errorf("the idle fleet claimed: %+v", res.IdleFleet)
	}
	// Counted by the runtimes themselves: the server's counts through a
	// pooler come in late.
	if res.MaxProcessClaimsPerRow > 1 || res.ClientClaims > uint64(fleetProcesses*rows) || res.ClientClaims < rows {
		t.Errorf("claims: %d in all, at most %.2f per row from one process (want at most %d, one per process per row)",
			res.ClientClaims, res.MaxProcessClaimsPerRow, fleetProcesses*rows)
	}
}
