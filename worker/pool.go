package worker

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pingAfter is how long a pooled connection sits idle before ShouldPing
// has it checked.
const pingAfter = time.Minute

// ShouldPing is a pgxpool.Config.ShouldPing for a worker's pool; pgworker
// run's pool uses it. It hands out a connection idle for less than a minute
// without a round trip to check it first, and checks one idle for longer.
//
// pgx's default checks every connection idle for more than a second. When
// rows come less often than that, each claim then waits between the
// notification and the claim for a round trip to the server (or through
// PgBouncer to it): 0.4-0.5 ms on one machine, of which the claim gives
// back a part (it wakes the server's backend instead), more across a
// network. A connection that broke meanwhile fails the statement that takes
// it instead: a claim or a heartbeat is sent again at once on another
// connection, an outcome after the recorder's first backoff (50-100 ms).
//
//	cfg, err := pgxpool.ParseConfig(url)
//	if err != nil {
//		return err
//	}
//	cfg.ShouldPing = worker.ShouldPing
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
func ShouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	return p.IdleDuration > pingAfter
}
