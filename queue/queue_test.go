package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
	"github.com/pgworker/pgworker/migrations"
	"github.com/pgworker/pgworker/queue"
)

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// The …Tx variants queue rows only when the caller's transaction commits.
func TestEnqueueTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	q := queue.New(pool, nil)
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // the caller's own work
			t.Fatal(err)
		}
		id, err := q.EnqueueTx(ctx, tx, "one.csv", &queue.EnqueueOpts{Queue: "tx"})
		if err != nil || id < 1 {
			t.Fatalf("EnqueueTx: %d, %v", id, err)
		}
		n, err := q.EnqueueManyTx(ctx, tx, []string{"a.csv", "b.csv", "c.csv"}, &queue.EnqueueOpts{Queue: "tx"})
		if err != nil || n != 3 {
			t.Fatalf("EnqueueManyTx: %d, %v", n, err)
		}
		if got := count(t, pool, "SELECT count(*) FROM files.files"); got != 0 {
			t.Errorf("%d rows visible before the transaction ends", got)
		}
		want := 0
		if commit {
			err, want = tx.Commit(ctx), 4
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := count(t, pool, "SELECT count(*) FROM files.files WHERE queue = 'tx' AND state = 'pending'"); got != want {
			t.Errorf("commit %v: %d rows queued, want %d", commit, got, want)
		}
	}
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	q := queue.New(pool, nil)

	id, err := q.Enqueue(ctx, "plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM files.files WHERE id = $1 AND source = 'plain' AND queue = 'default'
		AND priority = 0 AND max_attempts = 5 AND payload = '{}'`, id); n != 1 {
		t.Error("Enqueue without options did not take the defaults")
	}
	opts := &queue.EnqueueOpts{Queue: "img", Priority: -3, MaxAttempts: 2, Payload: json.RawMessage(`{"size": 200}`)}
	if _, err := q.Enqueue(ctx, "one", opts); err != nil {
		t.Fatal(err)
	}
	if n, err := q.EnqueueMany(ctx, []string{"two", "three"}, opts); err != nil || n != 2 {
		t.Fatalf("EnqueueMany: %d, %v", n, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM files.files WHERE queue = 'img' AND priority = -3 AND max_attempts = 2
		AND payload->>'size' = '200'`); n != 3 {
		t.Errorf("%d rows with the options, want 3", n)
	}

	// Bad input is refused before anything is sent, whole batches at once.
	for _, tt := range []struct {
		name    string
		sources []string
		opts    *queue.EnqueueOpts
		want    error
	}{
		{"empty source", []string{"ok", ""}, nil, queue.ErrInvalidSource},
		{"NUL", []string{"a\x00b"}, nil, queue.ErrInvalidSource},
		{"long queue", []string{"x"}, &queue.EnqueueOpts{Queue: strings.Repeat("q", migrations.MaxQueueNameLength+1)}, queue.ErrInvalidQueue},
		{"array payload", []string{"x"}, &queue.EnqueueOpts{Payload: json.RawMessage(`[1]`)}, queue.ErrInvalidPayload},
		{"two payloads", []string{"x"}, &queue.EnqueueOpts{Payload: json.RawMessage(`{} {}`)}, queue.ErrInvalidPayload},
		{"payload over 1 MiB", []string{"x"},
			&queue.EnqueueOpts{Payload: json.RawMessage(`{"a": "` + strings.Repeat("x", queue.MaxPayloadBytes) + `"}`)}, queue.ErrPayloadTooLarge},
	} {
		if _, err := q.EnqueueMany(ctx, tt.sources, tt.opts); !errors.Is(err, tt.want) {
			t.Errorf("%s: EnqueueMany: %v, want %v", tt.name, err, tt.want)
		}
		if _, err := q.Enqueue(ctx, tt.sources[len(tt.sources)-1], tt.opts); !errors.Is(err, tt.want) {
			t.Errorf("%s: Enqueue: %v, want %v", tt.name, err, tt.want)
		}
	}
	if n := count(t, pool, "SELECT count(*) FROM files.files"); n != 4 {
		t.Errorf("%d rows after the refusals, want 4", n)
	}
	// A queue name is counted in characters, as the schema counts it.
	wide := strings.Repeat("é", migrations.MaxQueueNameLength)
	if _, err := q.Enqueue(ctx, "wide", &queue.EnqueueOpts{Queue: wide}); err != nil {
		t.Errorf("queue name of %d characters in %d bytes: %v", migrations.MaxQueueNameLength, len(wide), err)
	}
	if _, err := q.Enqueue(ctx, "wider", &queue.EnqueueOpts{Queue: wide + "é"}); !errors.Is(err, queue.ErrInvalidQueue) {
		t.Errorf("queue name of %d characters: %v, want ErrInvalidQueue", migrations.MaxQueueNameLength+1, err)
	}
	// A payload just under the bound goes through.
	big := json.RawMessage(`{"a":"` + strings.Repeat("x", queue.MaxPayloadBytes-10) + `"}`)
	if _, err := q.Enqueue(ctx, "big", &queue.EnqueueOpts{Payload: big}); err != nil {
		t.Errorf("payload of %d bytes: %v", len(big), err)
	}
}

func TestRetryCancelPauseResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	q := queue.New(pool, nil)
	if _, err := q.EnqueueMany(ctx, []string{"r1", "r2", "r3"}, &queue.EnqueueOpts{Queue: "q"}); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	rows, _ := pool.Query(ctx, "SELECT id FROM files.files ORDER BY id")
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		ids = append(ids, id)
	}
	var id int64
	var att int
	var token string
	if err := pool.QueryRow(ctx, "SELECT id, attempt, claim_token FROM files.claim('w:1:0')").Scan(&id, &att, &token); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT files.fail($1, 'w:1:0', $2, $3, 'broken', false)", id, att, token); err != nil {
		t.Fatal(err)
	}

	if n, err := q.RetryFailed(ctx, &queue.RetryOpts{Queue: "other"}); err != nil || n != 0 {
		t.Errorf("RetryFailed in another queue: %d, %v", n, err)
	}
	if n, err := q.RetryFailed(ctx, nil); err != nil || n != 1 {
		t.Errorf("RetryFailed: %d, %v", n, err)
	}
	if n, err := q.Cancel(ctx, []int64{ids[0], ids[1], 999999}); err != nil || n != 2 {
		t.Errorf("Cancel: %d, %v", n, err)
	}
	if n, err := q.Retry(ctx, nil, nil); err != nil || n != 0 {
		t.Errorf("Retry of no ids retried %d rows (%v): it must not mean every failed row", n, err)
	}
	if n, err := q.Retry(ctx, []int64{ids[0], ids[2]}, nil); err != nil || n != 1 {
		t.Errorf("Retry: %d, %v", n, err)
	}
	if known, err := q.Pause(ctx, "q"); err != nil || !known {
		t.Errorf("Pause: %v, %v", known, err)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.claim('w:1:0', ARRAY['q'])"); n != 0 {
		t.Error("a paused queue handed out a row")
	}
	if err := q.Resume(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "SELECT count(*) FROM files.claim('w:1:0', ARRAY['q'])"); n != 1 {
		t.Error("a resumed queue handed out no row")
	}
	if err := q.Resume(ctx, "nope"); !errors.Is(err, queue.ErrNoQueue) {
		t.Errorf("Resume of an unknown queue: %v", err)
	}
	for _, err := range []error{q.Resume(ctx, ""), func() error { _, err := q.Pause(ctx, ""); return err }()} {
		if !errors.Is(err, queue.ErrInvalidQueue) {
			t.Errorf("an empty queue name: %v", err)
		}
	}
}

func TestStatusAndScaleHint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	q := queue.New(pool, nil)
	if _, err := q.EnqueueMany(ctx, []string{"a", "b"}, &queue.EnqueueOpts{Queue: "img"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT files.register_worker('n:1:0', 'n', 1, 0, 'v')"); err != nil {
		t.Fatal(err)
	}
	st, err := q.Status(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Queues) != 1 || st.Queues[0].Queue != "img" || st.Queues[0].Pending != 2 || st.Queues[0].OldestPendingSeconds == nil {
		t.Errorf("queues: %+v", st.Queues)
	}
	if len(st.ActiveWorkers) != 1 || st.ActiveWorkers[0].WorkerID != "n:1:0" || st.ActiveWorkers[0].FileID != nil {
		t.Errorf("active workers: %+v", st.ActiveWorkers)
	}
	lo, hi := 2, 9
	h, err := q.ScaleHint(ctx, &queue.ScaleHintOpts{MinNodes: &lo, MaxNodes: &hi})
	if err != nil {
		t.Fatal(err)
	}
	if h.MinNodes != 2 || h.MaxNodes != 9 || h.Fleet.Queue != nil || h.Fleet.Pending != 2 || h.Fleet.Nodes != 1 ||
		len(h.Queues) != 1 || *h.Queues[0].Queue != "img" || h.Fleet.DesiredNodes < 2 {
		t.Errorf("scale hint: %+v", h)
	}
}

func TestCheckSource(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, err string }{
		{"photos/a b.jpg", ""}, {"ünïcödé/✓", ""}, {"s3://bucket/key", ""},
		{"", "empty"}, {"a\x00b", "NUL byte at byte 2"}, {"ab\xffc", "invalid UTF-8 at byte 3"},
		{strings.Repeat("x", queue.MaxSourceBytes), ""}, {strings.Repeat("x", queue.MaxSourceBytes+1), "longer than"},
	} {
		err := queue.CheckSource(tt.in)
		if (tt.err == "") != (err == nil) || err != nil && (!strings.Contains(err.Error(), tt.err) || !errors.Is(err, queue.ErrInvalidSource)) {
			t.Errorf("CheckSource(%.20q) = %v, want %q", tt.in, err, tt.err)
		}
	}
}
