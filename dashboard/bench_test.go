package dashboard_test

import (
	"context"
	"flag"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/pgworker/pgworker/dashboard"
)

var (
	benchRows  = flag.Int("dashboard.rows", 100_000, "rows of files.files the benchmarks seed (the issue's scale is 10000000)")
	benchSlots = flag.Int("dashboard.slots", 200, "live worker slots the benchmarks seed")
)

// BenchmarkPages measures each page's handler, and the shared refresh that
// the Overview, Workers and Failures pages are rendered from, on a seeded
// database: go test ./dashboard -run '^$' -bench Pages -args
// -dashboard.rows=10000000 -dashboard.slots=2000.
func BenchmarkPages(b *testing.B) {
	s := newStack(b, nil, &dashboard.Config{Interval: time.Hour, SlowInterval: time.Hour, MinInterval: time.Millisecond,
		QueryTimeout: 5 * time.Minute})
	start := time.Now()
	failed := seedScale(b, s, *benchRows, *benchSlots)
	b.Logf("seeded %d rows, %d slots, %d attempts in %s", *benchRows, *benchSlots, *benchRows/10, time.Since(start).Round(time.Second))
	ctx := context.Background()
	// What the shared loop costs the database per refresh, whatever the
	// number of browsers: the views, the slots, the failure groups, the
	// chart.
	b.Run("refresh", func(b *testing.B) {
		before := s.dash.Stats()
		for b.Loop() {
			if err := s.dash.Refresh(ctx); err != nil {
				b.Fatal(err)
			}
		}
		after := s.dash.Stats()
		n := after.Refreshes - before.Refreshes
		b.ReportMetric(float64((after.RefreshTime-before.RefreshTime).Microseconds())/1000/float64(n), "ms/refresh")
	})
	// What a refresh costs that a notification or the clock starts while
	// somebody watches (the failure groups and the chart are not read).
	b.Run("live-refresh", func(b *testing.B) {
		st := s.openEvents("overview")
		last := st.await(b, "the first snapshot", func(sseEvent) bool { return true }).Gen
		before := s.dash.Stats()
		for b.Loop() {
			s.exec(`INSERT INTO files.files (queue, source) VALUES ('bench', 'x')`) // notifies files_pending
			last = st.await(b, "the refresh", func(ev sseEvent) bool { return ev.Gen > last }).Gen
		}
		after := s.dash.Stats()
		n := after.Refreshes - before.Refreshes
		b.ReportMetric(float64((after.RefreshTime-before.RefreshTime).Microseconds())/1000/float64(n), "ms/refresh")
	})
	for _, p := range []struct{ name, path string }{
		{"overview", "/"},
		{"workers", "/workers"},
		{"failures", "/failures"},
		{"failure-group", "/failures?group=" + url.QueryEscape("exit status 3")},
		{"row", "/rows/" + strconv.FormatInt(failed, 10)},
		{"queues", "/queues"},
	} {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := http.Get(s.url(p.path))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("%s: %s", p.path, resp.Status)
				}
			}
			reportMS(b)
		})
	}
}

func reportMS(b *testing.B) {
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
}

// seedScale writes rows rows (80% done, 5% failed, the rest pending but
// slots running), slots live slots on slots/16 nodes each holding a row,
// and an attempt for every tenth row; it returns a failed row.
func seedScale(b *testing.B, s *stack, rows, slots int) int64 {
	b.Helper()
	s.exec(`INSERT INTO files.files (queue, source, state, attempt, created_at, claimed_at, finished_at, last_error, result)
	        SELECT 'q' || (g % 4), 'scans/' || lpad(g::text, 9, '0') || '.tif',
	               CASE WHEN g % 100 < 80 THEN 'done' WHEN g % 100 < 85 THEN 'failed' ELSE 'pending' END,
	               CASE WHEN g % 100 < 85 THEN 1 ELSE 0 END,
	               now() - interval '2 hours', now() - interval '1 hour',
	               CASE WHEN g % 100 < 85 THEN now() - (g % 3600) * interval '1 second' END,
	               CASE WHEN g % 100 BETWEEN 80 AND 84 THEN 'exit status ' || (g % 7) || E'\nError in line ' || g END,
	               CASE WHEN g % 100 < 80 THEN jsonb_build_object('outputs', jsonb_build_array(jsonb_build_object(
	                   'url', 's3://out/' || g || '/1-x/page.txt', 'key', g || '/1-x/page.txt', 'size', 100, 'sha256', md5(g::text)))) END
	        FROM generate_series(1, $1::int) g`, rows)
	s.exec(`INSERT INTO files.workers (worker_id, node, pid, slot, state, version, last_heartbeat_at)
	        SELECT 'node-' || (g / 16) || ':' || (1000 + g / 16) || ':' || (g % 16), 'node-' || (g / 16), 1000 + g / 16, g % 16,
	               'active', '0.9.0', now()
	        FROM generate_series(0, $1::int - 1) g`, slots)
	s.exec(`WITH w AS (SELECT worker_id, row_number() OVER () AS n FROM files.workers),
	             f AS (SELECT id, row_number() OVER () AS n FROM (SELECT id FROM files.files WHERE state = 'pending' LIMIT $1) x)
	        UPDATE files.files x SET state = 'running', worker_id = w.worker_id, attempt = 1, claimed_at = now(),
	               lease_expires_at = now() + interval '15 seconds'
	        FROM w JOIN f USING (n) WHERE x.id = f.id`, slots)
	s.exec(`INSERT INTO files.attempts (file_id, attempt, worker_id, started_at, finished_at, outcome, error, exit_code, duration)
	        SELECT f.id, 1, 'node-' || (f.id % 16) || ':1:0', f.finished_at - interval '20 seconds', f.finished_at,
	               f.state, f.last_error, CASE WHEN f.state = 'failed' THEN 3 ELSE 0 END, interval '20 seconds'
	        FROM files.files f WHERE f.id % 10 = 0 AND f.state IN ('done', 'failed') ORDER BY f.finished_at`)
	s.exec(`ANALYZE files.files; ANALYZE files.attempts; ANALYZE files.workers`)
	var id int64
	if err := s.pool.QueryRow(context.Background(),
		`SELECT max(id) FROM files.files WHERE state = 'failed' AND id % 10 = 0`).Scan(&id); err != nil {
		b.Fatal(err)
	}
	return id
}
