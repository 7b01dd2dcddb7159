package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The statements of Notify, on the table of SkipLocked: a one-row insert,
// bare or with a notification in the same statement (its payload the row's
// source, so that each notification can be matched to its row), and the
// bare queue's claim, committed asynchronously as pgworker run's claims are,
// and completion, committed as pgworker run's outcomes are.
const (
	notifyChannel   = "pgworker_bench_notify"
	sqlNotifyListen = `LISTEN ` + notifyChannel
	sqlBareInsert   = `INSERT INTO ` + skipSchema + `.files (queue, source) VALUES ($1, $2) RETURNING id`
	sqlBareNotify   = `WITH i AS (INSERT INTO ` + skipSchema + `.files (queue, source) VALUES ($1, $2) RETURNING id)
SELECT i.id FROM i, pg_notify('` + notifyChannel + `', $2)`
	sqlBareClaim = `UPDATE ` + skipSchema + `.files f SET state = 'running', worker_id = $2, attempt = f.attempt + 1,
    claimed_at = now(), lease_expires_at = now() + interval '15 seconds'
WHERE f.id IN (SELECT id FROM ` + skipSchema + `.files WHERE state = 'pending' AND queue = $1
    ORDER BY priority DESC, id LIMIT $3 FOR UPDATE SKIP LOCKED)
  AND set_config('synchronous_commit', 'off', true) IS NOT NULL
RETURNING f.id, f.source`
	sqlListenPending = `LISTEN files_pending`
	sqlBareTruncate  = `TRUNCATE ` + skipSchema + `.files`
)

// The phases of Notify, in the order they run.
const (
	PhaseInsert  = "insert"  // the bare insert
	PhaseNotify  = "notify"  // the insert and a notification, no session listening
	PhaseListen  = "listen"  // the same, one session listening
	PhaseQueue   = "queue"   // the bare queue: the same, and each notification answered by a claim
	PhaseEnqueue = "enqueue" // pgworker's own insert into files.files, a session listening on files_pending
	PhaseAPI     = "api"     // the queue through the SQL API: the same, each notification answered by files.claim_batch
)

// notifyClaimBatch is the most rows the bare queue claims at once; a claim
// that gets as many claims again at once, as pgworker run's do.
const notifyClaimBatch = 10

// apiSlots are the slots the API phase claims for; apiAsk the most idle
// ones a claim asks rows for, as pgworker run asks for two when rows come
// one at a time (a claim that fills them all is followed by another).
const (
	apiSlots = 2 * notifyClaimBatch
	apiAsk   = 2
)

// notifyWarmup rows go through each phase before its measurement.
const notifyWarmup = 5

// NotifyConfig sizes a Notify run. A nil or zero config works.
type NotifyConfig struct {
	// Rate of inserts per second, one row per transaction, in each phase.
	// Defaults to 200.
	Rate float64
	// Duration of each phase's inserts. Defaults to 10s.
	Duration time.Duration
	// PickupTimeout bounds the wait for the bare queue to end its rows.
	// Defaults to 30s.
	PickupTimeout time.Duration
}

// NotifyResult is what Notify measured.
type NotifyResult struct {
	Setup
	Rate   float64       `json:"rate"`
	Phases []NotifyPhase `json:"phases"`
}

// NotifyPhase is one phase of Notify: what its rows cost the server, from
// the start of its inserts to the last insert's commit (to the last row's
// completion in the queue phase).
type NotifyPhase struct {
	Name       string  `json:"name"`
	Rows       int     `json:"rows"`
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
	// ServerCPUMSPerRow is the CPU time of every process of the server
	// (from /proc) over the rows, as in CPU.
	ServerCPUMSPerRow float64 `json:"server_cpu_ms_per_row"`
	// WALBytesPerRow is the server's WAL written over the rows.
	WALBytesPerRow float64 `json:"wal_bytes_per_row"`
	// Pickup, of the queue and API phases only, runs from an insert's
	// commit returning to the answer of the claim that took its row;
	// CommitToNotify to its notification reaching the listening session
	// (negative when it came first; of the queue phase only, whose
	// notifications name their row), Claim is the claim's round trip.
	Pickup         *Percentiles `json:"pickup,omitempty"`
	CommitToNotify *Percentiles `json:"commit_to_notify,omitempty"`
	Claim          *Percentiles `json:"claim,omitempty"`
}

// Notify measures what a LISTEN/NOTIFY queue costs the database with no
// queue software, on the table of SkipLocked (created in a schema of its
// own and dropped at the end). Five phases each insert cfg.Rate rows per
// second, one per transaction, for cfg.Duration: the bare insert; the
// insert with a notification in the same statement, first with no session
// listening, then with one; the bare queue, where that session's notifications are answered at once
// by a bare claim (FOR UPDATE SKIP LOCKED) and a completion, which times
// the pickup a queue on this database can approach; pgworker's own
// insert into files.files, its trigger and a session listening on
// files_pending, with no worker; and the queue through the SQL API, that
// insert answered by files.claim_batch and files.complete_many as pgworker
// run calls them, with no runtime: the pickup the SQL API leaves the
// runtime. Each phase's server CPU per row says what each step costs.
func (b *Bench) Notify(ctx context.Context, cfg *NotifyConfig) (*NotifyResult, error) {
	c := NotifyConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Rate = orDefault(c.Rate, 200)
	c.Duration = orDefault(c.Duration, 10*time.Second)
	c.PickupTimeout = orDefault(c.PickupTimeout, 30*time.Second)
	res := &NotifyResult{Rate: c.Rate}
	err := b.run(ctx, "notify", func(ctx context.Context) (err error) {
		res.Setup = b.setup("notify")
		server, err := b.findServerCPU(ctx)
		if err != nil {
			return err
		}
		drop, err := b.bareTable(ctx, false)
		defer func() { err = errors.Join(err, drop()) }()
		if err != nil {
			return err
		}
		inserters, err := b.workerPool(ctx, producers, nil)
		if err != nil {
			return err
		}
		defer inserters.Close()
		n := max(int(c.Rate*c.Duration.Seconds()), 1)
		r := &notifyRun{b: b, c: &c, server: server, inserters: inserters, rows: n}
		for _, phase := range []string{PhaseInsert, PhaseNotify, PhaseListen, PhaseQueue, PhaseEnqueue, PhaseAPI} {
			p, err := r.phase(ctx, phase)
			if err != nil {
				return fmt.Errorf("bench: phase %s: %w", phase, err)
			}
			res.Phases = append(res.Phases, *p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// notifyRun holds what Notify's phases share.
type notifyRun struct {
	b         *Bench
	c         *NotifyConfig
	server    *serverCPU
	inserters *pgxpool.Pool
	rows      int
	next      int // the sequence number of the next row, over all phases
}

// phase runs one phase: its warm-up rows, then its measured rows. Its
// sessions are its own, closed at its end.
func (r *notifyRun) phase(ctx context.Context, name string) (_ *NotifyPhase, err error) {
	insert, listen := sqlBareNotify, sqlNotifyListen
	switch name {
	case PhaseInsert:
		insert, listen = sqlBareInsert, ""
	case PhaseNotify:
		listen = ""
	case PhaseEnqueue, PhaseAPI:
		insert, listen = sqlInsertOne, sqlListenPending
	}
	served := name == PhaseQueue || name == PhaseAPI
	// Each phase starts on empty tables: a queue would take the rows of the
	// phases before it first.
	if _, err := r.inserters.Exec(ctx, sqlBareTruncate); err != nil {
		return nil, err
	}
	if name == PhaseAPI {
		if err := r.b.cleanup(ctx); err != nil {
			return nil, err
		}
	}
	var slots *apiSlotSet
	if name == PhaseAPI {
		// Stopped last, once the claimer and the completer are done.
		slots = newAPISlots()
		defer func() { err = errors.Join(err, slots.deregister(context.WithoutCancel(ctx), r.b)) }()
	}
	tr := newBareTrace()
	if listen != "" {
		conns, err := r.b.clients(ctx, 3) // the listening session, the claimer and the completer
		defer closeAll(ctx, conns)
		if err != nil {
			return nil, err
		}
		pctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer wg.Wait() // before the sessions close
		defer stop()
		if _, err := conns[0].Exec(ctx, listen); err != nil {
			return nil, err
		}
		bell := make(chan struct{}, 1)
		wg.Go(func() { tr.listen(pctx, conns[0], bell) })
		switch name {
		case PhaseQueue:
			claimed := make(chan taken, 64)
			wg.Go(func() { tr.serve(pctx, conns[1], bell, claimed, tr.claimBare) })
			wg.Go(func() { tr.complete(pctx, conns[2], claimed, completeBare) })
		case PhaseAPI:
			claimed := make(chan taken, 64)
			wg.Go(func() { tr.serve(pctx, conns[1], bell, claimed, slots.claim(tr)) })
			wg.Go(func() { tr.complete(pctx, conns[2], claimed, slots.complete) })
		}
	}
	// Warm-up: the sessions' first statements and plans, not measured.
	if err := r.insertAtRate(ctx, insert, notifyWarmup, tr); err != nil {
		return nil, err
	}
	if err := tr.waitDone(ctx, served, notifyWarmup, r.c.PickupTimeout); err != nil {
		return nil, err
	}
	lsn, cpu, err := r.reading(ctx)
	if err != nil {
		return nil, err
	}
	first := r.next
	t0 := time.Now()
	if err := r.insertAtRate(ctx, insert, r.rows, tr); err != nil {
		return nil, err
	}
	if err := tr.waitDone(ctx, served, notifyWarmup+r.rows, r.c.PickupTimeout); err != nil {
		return nil, err
	}
	elapsed := time.Since(t0)
	lsn2, cpu2, err := r.reading(ctx)
	if err != nil {
		return nil, err
	}
	var wal float64
	if err := r.inserters.QueryRow(ctx, sqlWALBytes, lsn2, lsn).Scan(&wal); err != nil {
		return nil, err
	}
	n := float64(r.rows)
	p := &NotifyPhase{Name: name, Rows: r.rows, ElapsedMS: ms(elapsed), RowsPerSec: round(n/elapsed.Seconds(), 1),
		ServerCPUMSPerRow: round(ms(cpu2-cpu)/n, 4), WALBytesPerRow: round(wal/n, 1)}
	if served {
		if err := tr.pickups(p, first, r.next); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// reading is the server's WAL position and CPU time now.
func (r *notifyRun) reading(ctx context.Context) (string, time.Duration, error) {
	var lsn string
	if err := r.inserters.QueryRow(ctx, sqlWALLSN).Scan(&lsn); err != nil {
		return "", 0, err
	}
	cpu, err := r.server.total()
	return lsn, cpu, err
}

// insertAtRate inserts the next n rows with stmt as CPU's inserts are,
// noting when each commit returned; their sources number them over every
// phase, so that a notification and a claim name their row.
func (r *notifyRun) insertAtRate(ctx context.Context, stmt string, n int, tr *bareTrace) error {
	first := r.next
	r.next += n
	tr.grow(r.next)
	return insertAtRate(ctx, r.inserters, n, r.c.Rate, stmt,
		func(i int) string { return "notify/" + strconv.Itoa(first+i) }, func(i int) { tr.committed(first + i) })
}

// bareTrace times each row of the bare queue: its insert's commit, its
// notification, and the claim that took it.
type bareTrace struct {
	mu        sync.Mutex
	commit    []time.Time
	notified  []time.Time
	claimed   []time.Time
	claimTook []time.Duration // the round trip of the claim that took the row
	done      int             // rows completed
	changed   chan struct{}   // closed and replaced when done grows
	err       error           // the claimer's, if it stopped on one
}

func newBareTrace() *bareTrace { return &bareTrace{changed: make(chan struct{})} }

// grow makes room for rows up to n.
func (t *bareTrace) grow(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.commit) < n {
		t.commit = append(t.commit, time.Time{})
		t.notified = append(t.notified, time.Time{})
		t.claimed = append(t.claimed, time.Time{})
		t.claimTook = append(t.claimTook, 0)
	}
}

func (t *bareTrace) committed(seq int) {
	now := time.Now()
	t.mu.Lock()
	t.commit[seq] = now
	t.mu.Unlock()
}

// listen reads the session's notifications until ctx ends, noting when each
// row's came and ringing bell.
func (t *bareTrace) listen(ctx context.Context, conn *pgx.Conn, bell chan<- struct{}) {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		now := time.Now()
		if seq, ok := seqOf(n.Payload); ok {
			t.mu.Lock()
			if seq < len(t.notified) {
				t.notified[seq] = now
			}
			t.mu.Unlock()
		}
		select {
		case bell <- struct{}{}:
		default:
		}
	}
}

// taken is what one claim took: the rows' ids and, through the SQL API,
// what their outcomes need.
type taken struct {
	ids      []int64
	slots    []string
	attempts []int32
	tokens   []string
}

// serve is a queue's claimer: at each ring it claims with claimOnce, at
// once again while a claim comes back full, and hands what it took to
// complete, as pgworker run's slots hand their outcomes to a recorder of
// their own.
func (t *bareTrace) serve(ctx context.Context, conn *pgx.Conn, bell <-chan struct{}, claimed chan<- taken,
	claimOnce func(context.Context, *pgx.Conn) (taken, bool, error)) {
	defer close(claimed)
	for {
		select {
		case <-bell:
		case <-ctx.Done():
			return
		}
		for {
			got, full, err := claimOnce(ctx, conn)
			if err != nil {
				t.fail(ctx, err)
				return
			}
			if len(got.ids) > 0 {
				select {
				case claimed <- got:
				case <-ctx.Done():
					return
				}
			}
			if !full {
				break
			}
		}
	}
}

// complete records the outcomes of what was claimed: of every claim that
// waits for it in one statement, as pgworker run's recorder does.
func (t *bareTrace) complete(ctx context.Context, conn *pgx.Conn, claimed <-chan taken,
	record func(context.Context, *pgx.Conn, taken) error) {
	for got := range claimed {
	waiting:
		for {
			select {
			case more, ok := <-claimed:
				if !ok {
					break waiting
				}
				got.ids, got.slots = append(got.ids, more.ids...), append(got.slots, more.slots...)
				got.attempts, got.tokens = append(got.attempts, more.attempts...), append(got.tokens, more.tokens...)
			default:
				break waiting
			}
		}
		if err := record(ctx, conn, got); err != nil {
			t.fail(ctx, fmt.Errorf("complete: %w", err))
			return
		}
		t.mu.Lock()
		t.done += len(got.ids)
		t.wakeWaiters()
		t.mu.Unlock()
	}
}

// fail records the error that stopped the claimer or the completer, unless
// the phase was ending.
func (t *bareTrace) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil {
		t.err = err
	}
	t.wakeWaiters()
}

// wakeWaiters tells waitDone that done or err changed; t.mu is held.
func (t *bareTrace) wakeWaiters() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// claimBare claims up to notifyClaimBatch rows of the bare table and notes
// when each was taken; full when it took as many.
func (t *bareTrace) claimBare(ctx context.Context, conn *pgx.Conn) (taken, bool, error) {
	sent := time.Now()
	rows, err := conn.Query(ctx, sqlBareClaim, Queue, "bare", notifyClaimBatch)
	if err != nil {
		return taken{}, false, fmt.Errorf("claim: %w", err)
	}
	var got taken
	var seqs []int
	for rows.Next() {
		var id int64
		var source string
		if err := rows.Scan(&id, &source); err != nil {
			rows.Close()
			return taken{}, false, fmt.Errorf("claim: %w", err)
		}
		seq, ok := seqOf(source)
		if !ok {
			rows.Close()
			return taken{}, false, fmt.Errorf("claim: a row of source %q", source)
		}
		got.ids, seqs = append(got.ids, id), append(seqs, seq)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return taken{}, false, fmt.Errorf("claim: %w", err)
	}
	t.took(seqs, sent, time.Now())
	return got, len(got.ids) == notifyClaimBatch, nil
}

// completeBare marks the bare table's claimed rows done.
func completeBare(ctx context.Context, conn *pgx.Conn, got taken) error {
	_, err := conn.Exec(ctx, sqlSkipComplete, got.ids)
	return err
}

// took notes that a claim sent at sent and answered at answered took the
// rows seqs.
func (t *bareTrace) took(seqs []int, sent, answered time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, seq := range seqs {
		if seq < len(t.claimed) {
			t.claimed[seq], t.claimTook[seq] = answered, answered.Sub(sent)
		}
	}
}

// The API phase's statements: the claim of pgworker run, its columns
// those the outcome needs, and the outcome through files.complete_many
// (sqlAPIComplete).
const sqlAPIClaimSources = `SELECT id, source, worker_id, attempt, claim_token FROM files.claim_batch($1::text[], ARRAY[$2::text], $3)
WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL`

// apiSlotSet holds the slots of the API phase: their ids, their key, and
// the ones holding no row.
type apiSlotSet struct {
	ids  []string
	key  string
	free chan string
}

func newAPISlots() *apiSlotSet {
	pid := strconv.Itoa(os.Getpid())
	s := &apiSlotSet{key: "pgworker-bench-key-" + pid, free: make(chan string, apiSlots)}
	for i := range apiSlots {
		id := workerPrefix + pid + ":notify:" + strconv.Itoa(i)
		s.ids = append(s.ids, id)
		s.free <- id
	}
	return s
}

// claim returns the API phase's claimOnce: files.claim_batch for up to
// apiAsk slots holding no row (waiting for one when all hold a row), full
// when every slot asked for took a row.
func (s *apiSlotSet) claim(t *bareTrace) func(context.Context, *pgx.Conn) (taken, bool, error) {
	return func(ctx context.Context, conn *pgx.Conn) (taken, bool, error) {
		var ask []string
		select {
		case id := <-s.free:
			ask = append(ask, id)
		case <-ctx.Done():
			return taken{}, false, nil
		}
	more:
		for len(ask) < apiAsk {
			select {
			case id := <-s.free:
				ask = append(ask, id)
			default:
				break more
			}
		}
		sent := time.Now()
		rows, err := conn.Query(ctx, sqlAPIClaimSources, ask, Queue, s.key)
		if err != nil {
			return taken{}, false, fmt.Errorf("claim: %w", err)
		}
		var got taken
		var seqs []int
		for rows.Next() {
			var (
				id                  int64
				source, slot, token string
				attempt             int32
			)
			if err := rows.Scan(&id, &source, &slot, &attempt, &token); err != nil {
				rows.Close()
				return taken{}, false, fmt.Errorf("claim: %w", err)
			}
			seq, ok := seqOf(source)
			if !ok {
				rows.Close()
				return taken{}, false, fmt.Errorf("claim: a row of source %q", source)
			}
			got.ids, got.slots = append(got.ids, id), append(got.slots, slot)
			got.attempts, got.tokens = append(got.attempts, attempt), append(got.tokens, token)
			seqs = append(seqs, seq)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return taken{}, false, fmt.Errorf("claim: %w", err)
		}
		t.took(seqs, sent, time.Now())
		for _, id := range ask {
			if !slices.Contains(got.slots, id) {
				s.free <- id
			}
		}
		return got, len(got.ids) == len(ask), nil
	}
}

// complete records the claimed rows done through files.complete_many and
// frees their slots.
func (s *apiSlotSet) complete(ctx context.Context, conn *pgx.Conn, got taken) error {
	var n int
	if err := conn.QueryRow(ctx, sqlAPIComplete, got.ids, got.slots, got.attempts, got.tokens).Scan(&n); err != nil {
		return err
	}
	if n != len(got.ids) {
		return fmt.Errorf("files.complete_many recorded %d of %d outcomes", n, len(got.ids))
	}
	for _, id := range got.slots {
		s.free <- id
	}
	return nil
}

// deregister stops the slots, so that the cleanup deletes them.
func (s *apiSlotSet) deregister(ctx context.Context, b *Bench) error {
	if _, err := b.pool.Exec(ctx, sqlAPIDeregister, s.ids, s.key); err != nil {
		return fmt.Errorf("bench: deregister the slots: %w", err)
	}
	return nil
}

// waitDone waits until the phase's queue has completed n rows, if served.
func (t *bareTrace) waitDone(ctx context.Context, served bool, n int, timeout time.Duration) error {
	if !served {
		return nil
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		done, err, changed := t.done, t.err, t.changed
		t.mu.Unlock()
		switch {
		case err != nil:
			return err
		case done >= n:
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("%d of %d rows done after %s", done, n, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// pickups sets a served phase's pickup and its steps, of the rows from
// first to end; the notifications' arrival when they named their rows.
func (t *bareTrace) pickups(p *NotifyPhase, first, end int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var pickup, notify, claim []time.Duration
	for seq := first; seq < end; seq++ {
		if t.claimed[seq].IsZero() {
			return fmt.Errorf("row %d was not claimed", seq)
		}
		pickup = append(pickup, t.claimed[seq].Sub(t.commit[seq]))
		claim = append(claim, t.claimTook[seq])
		if !t.notified[seq].IsZero() {
			notify = append(notify, t.notified[seq].Sub(t.commit[seq]))
		}
	}
	pu, cl := percentiles(pickup), percentiles(claim)
	p.Pickup, p.Claim = &pu, &cl
	if len(notify) > 0 {
		cn := percentiles(notify)
		p.CommitToNotify = &cn
	}
	return nil
}

// seqOf reads the sequence number of a source "notify/N".
func seqOf(source string) (int, bool) {
	s, ok := strings.CutPrefix(source, "notify/")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}
