package worker

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/claim"
	"github.com/pgworker/pgworker/internal/retry"
)

// heartbeater sends one heartbeat statement per interval for all the slots
// of a process, and one more when a cancellation hint asks for it (soon). It
// hands each answer to the running rows to reconcile, and releases the rows
// held there but unknown here: orphans, claims whose answer never arrived.
type heartbeater struct {
	pool     *pgxpool.Pool
	rows     heartbeatRows
	logger   *slog.Logger
	interval time.Duration
	lease    time.Duration
	key      string                    // the slots' key
	after    func(ctx context.Context) // after each heartbeat of the interval that succeeded; nil for none

	now      chan struct{}   // a hint asks for a heartbeat before the next tick
	suspects map[heldRow]int // held there and unknown here at the last heartbeat; run's goroutine only

	beats, errors, orphans atomic.Uint64
}

// heartbeatRows is what the heartbeater needs from the Worker.
type heartbeatRows interface {
	// WorkerIDs returns the slots to keep alive.
	WorkerIDs() []string
	// reconcile applies the answer held of a heartbeat sent at sent to the
	// running rows, leaves in held only the rows unknown here, and reports
	// whether those may be suspected. It returns the running rows missing
	// from held.
	reconcile(held map[int64]heldRow, sent time.Time) (missing []heldRow, suspect bool)
	// gone stops the handlers of the rows missing from a heartbeat, as
	// cancelled or lost by their attempts' outcomes (nil when unknown).
	gone(missing []heldRow, outcomes map[int64]string)
}

// heldRow is one row of a heartbeat's answer.
type heldRow struct {
	workerID string
	fileID   int64
	attempt  int32
}

// newHeartbeater returns a heartbeater of the slots of rows, proven by key.
// It beats once run runs.
func newHeartbeater(pool *pgxpool.Pool, rows heartbeatRows, logger *slog.Logger, interval, lease time.Duration, key string) *heartbeater {
	return &heartbeater{
		pool:     pool,
		rows:     rows,
		logger:   logger,
		interval: interval,
		lease:    lease,
		key:      key,
		now:      make(chan struct{}, 1),
		suspects: map[heldRow]int{},
	}
}

// soon asks for a heartbeat before the next tick.
func (h *heartbeater) soon() {
	select {
	case h.now <- struct{}{}:
	default: // a heartbeat is asked for already
	}
}

// run sends heartbeats until ctx ends.
func (h *heartbeater) run(ctx context.Context) {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	var down time.Time
	for {
		hinted := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.now:
			hinted = true
		}
		err := h.beat(ctx)
		for n := 1; n <= 10 && claim.RaceLost(err); n++ {
			// Under stricter isolation a concurrent complete can make the
			// heartbeat lose a race: that is not an outage, try again soon.
			if !retry.Sleep(ctx, time.Duration(n)*(2*time.Millisecond+rand.N(10*time.Millisecond))) {
				return
			}
			err = h.beat(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return
		case claim.RaceLost(err):
			h.errors.Add(1)
			h.logger.Debug("worker: heartbeat kept losing races; trying again next interval", "error", err)
		case err != nil:
			h.errors.Add(1)
			if down.IsZero() {
				down = time.Now()
				h.logger.Warn("worker: heartbeat failed; running rows will be reaped unless it recovers within the lease timeout",
					"lease_timeout", h.lease, "error", err)
			} else {
				h.logger.Debug("worker: heartbeat failed again", "error", err)
			}
		case !down.IsZero():
			h.logger.Info("worker: heartbeats recovered", "down_for", time.Since(down).Round(time.Millisecond))
			down = time.Time{}
		}
		if err == nil && !hinted && h.after != nil {
			h.after(ctx)
		}
	}
}

// beat sends one heartbeat and reconciles its answer with the running rows:
// a row missing from it was cancelled or lost, as its attempt's outcome
// says; a row held there but unknown here is an orphan (a claim whose answer
// never arrived) and is released.
func (h *heartbeater) beat(ctx context.Context) error {
	sent := time.Now()
	// A slow heartbeat is fine as long as it lands well within the lease.
	qctx, cancel := context.WithTimeout(ctx, h.lease/2)
	defer cancel()
	held, err := h.send(qctx)
	if err != nil && claim.ConnectionLost(err) && qctx.Err() == nil {
		// A connection that broke while it sat in the pool, handed out
		// unchecked (ShouldPing): once more at once, on another one.
		sent = time.Now()
		held, err = h.send(qctx)
	}
	if err != nil {
		return err
	}
	h.beats.Add(1)
	missing, suspect := h.rows.reconcile(held, sent)
	if !suspect {
		held = nil
	}
	if len(missing) > 0 {
		outcomes, err := h.outcomes(qctx, missing)
		if err != nil {
			h.logger.Debug("worker: cannot read why rows are gone; stopping them as lost", "rows", len(missing), "error", err)
		}
		h.rows.gone(missing, outcomes)
	}
	return h.releaseOrphans(qctx, h.suspect(held))
}

// outcomes asks the database how the attempts of rows missing from a
// heartbeat ended: files.cancel and files.reap record that in the
// transaction that takes a row, so the answer is there by now, while the
// cancellation's hint may still be on its way.
func (h *heartbeater) outcomes(ctx context.Context, missing []heldRow) (map[int64]string, error) {
	ids, workers, attempts := make([]int64, len(missing)), make([]string, len(missing)), make([]int32, len(missing))
	for i, m := range missing {
		ids[i], workers[i], attempts[i] = m.fileID, m.workerID, m.attempt
	}
	rows, err := h.pool.Query(ctx, sqlOutcomes, h.key, ids, workers, attempts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[int64]string, len(missing))
	for rows.Next() {
		var id int64
		var outcome string
		if err := rows.Scan(&id, &outcome); err != nil {
			return nil, err
		}
		out[id] = outcome
	}
	return out, rows.Err()
}

// send sends one heartbeat and returns the rows it says are held, by id.
func (h *heartbeater) send(ctx context.Context) (map[int64]heldRow, error) {
	rows, err := h.pool.Query(ctx, sqlHeartbeat, h.key, h.rows.WorkerIDs())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := map[int64]heldRow{}
	for rows.Next() {
		var r heldRow
		if err := rows.Scan(&r.workerID, &r.fileID, &r.attempt); err != nil {
			return nil, err
		}
		held[r.fileID] = r
	}
	return held, rows.Err()
}

// suspect takes the rows held there and unknown here, or nil when they may
// not be suspected, and returns those that were suspects already: held
// there, unknown here, suspect once, release the second time in a row.
func (h *heartbeater) suspect(unknown map[int64]heldRow) []heldRow {
	if unknown == nil {
		return nil
	}
	var orphans []heldRow
	suspects := make(map[heldRow]int, len(unknown))
	for _, r := range unknown {
		if h.suspects[r] > 0 {
			orphans = append(orphans, r)
		} else {
			suspects[r] = 1
		}
	}
	h.suspects = suspects
	return orphans
}

// releaseOrphans hands rows back that this process holds without knowing.
func (h *heartbeater) releaseOrphans(ctx context.Context, orphans []heldRow) error {
	for _, r := range orphans {
		var ok bool
		// Its claim token never arrived: the slot's key releases it.
		err := h.pool.QueryRow(ctx, sqlRelease, r.fileID, r.workerID, r.attempt, h.key, "not known to its worker").Scan(&ok)
		if err != nil {
			return err
		}
		if ok {
			h.orphans.Add(1)
			h.logger.Warn("worker: released a row held by this process but unknown to it", "file_id", r.fileID,
				"worker_id", r.workerID)
		}
	}
	return nil
}

// reconcile applies a heartbeat's answer, sent at sent, to the running rows:
// the rows missing from held are returned, for gone to stop as cancelled or
// lost. It leaves in held the rows unknown here, and reports false while a
// claim is in flight: its rows may be held there and not yet delivered here,
// however slow its answer, so nothing may be suspected then.
func (w *Worker) reconcile(held map[int64]heldRow, sent time.Time) (missing []heldRow, suspect bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, t := range w.running {
		h, ok := held[id]
		// Known here: another attempt of the row is settled by fencing.
		delete(held, id)
		// Still held; or, for a row whose claim answered after the heartbeat
		// was sent, missing legitimately; or, for one whose handler returned,
		// settled by its fenced call.
		if ok && h.workerID == t.row.WorkerID && int(h.attempt) == t.row.Attempt ||
			t.received.After(sent) || t.finishing || t.gone != nil {
			if at, hinted := w.hinted[id]; hinted && at.Before(sent) {
				delete(w.hinted, id) // this answer is the database's word on the hint
			}
			continue
		}
		missing = append(missing, heldRow{workerID: t.row.WorkerID, fileID: id, attempt: int32(t.row.Attempt)})
	}
	return missing, !w.claimer.InFlight()
}

// gone stops the handlers of rows a heartbeat no longer showed, each as
// cancelled when its attempt was (by outcomes, or, when outcomes does not
// say, by a hint that came meanwhile) and as lost otherwise; a row whose
// handler returned meanwhile is settled by its fenced call.
func (w *Worker) gone(missing []heldRow, outcomes map[int64]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range missing {
		t := w.running[m.fileID]
		if t == nil || t.row.WorkerID != m.workerID || t.row.Attempt != int(m.attempt) || t.finishing || t.gone != nil {
			continue
		}
		// The recorded outcome decides; a hint, which any role can send,
		// only when the database could not be asked.
		outcome, known := outcomes[m.fileID]
		_, hinted := w.hinted[m.fileID]
		delete(w.hinted, m.fileID)
		if outcome == "cancelled" || !known && hinted {
			w.stopRow(t, ErrCancelled)
		} else {
			w.stopRow(t, ErrLeaseLost)
		}
	}
}

// stopRow cancels the handler of t, a row no longer held by its attempt, with
// why (ErrCancelled or ErrLeaseLost): its outcome will be discarded. Called
// with w.mu held.
func (w *Worker) stopRow(t *task, why error) {
	t.gone = why
	t.cancel(why)
	if why == ErrCancelled {
		w.cancelled.Add(1)
		w.logger.Info("worker: row cancelled by an operator; stopping its handler", "file_id", t.row.ID,
			"worker_id", t.row.WorkerID)
		return
	}
	w.leaseLosses.Add(1)
	w.logger.Warn("worker: lease lost; cancelling the handler and discarding its outcome",
		"file_id", t.row.ID, "attempt", t.row.Attempt, "worker_id", t.row.WorkerID)
}

// reapLoop runs files.reap every reap interval, with jitter so that a fleet
// started together does not reap in step.
func (w *Worker) reapLoop(ctx context.Context) {
	for {
		d := w.reapEvery*4/5 + rand.N(w.reapEvery*2/5+1)
		if !retry.Sleep(ctx, d) {
			return
		}
		qctx, cancel := context.WithTimeout(ctx, w.lease)
		var n int32
		err := w.pool.QueryRow(qctx, sqlReap).Scan(&n)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			w.logger.Debug("worker: reap failed", "error", err)
		case n > 0:
			w.reaped.Add(uint64(n))
			w.logger.Info("worker: returned rows of silent workers to the queue", "rows", n)
		}
	}
}

// pruneLoop runs files.prune every prune interval, with jitter, and again
// at once while a call deletes as many rows as it may: each call is a short
// transaction of its own, so a large backlog of old rows goes in steps that
// never hold many locks. Another node's prune in progress makes a call
// return nothing; this one then waits for its next turn.
func (w *Worker) pruneLoop(ctx context.Context) {
	for {
		d := w.pruneEvery*4/5 + rand.N(w.pruneEvery*2/5+1)
		if !retry.Sleep(ctx, d) {
			return
		}
		var total int64
		for {
			qctx, cancel := context.WithTimeout(ctx, w.lease)
			var n int64
			err := w.pool.QueryRow(qctx, sqlPrune, w.pruneRows).Scan(&n)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				w.logger.Debug("worker: prune failed", "error", err)
				break
			}
			total += n
			w.pruned.Add(uint64(n))
			if n < int64(w.pruneRows) {
				break
			}
		}
		if total > 0 {
			w.logger.Info("worker: deleted finished rows past their retention", "rows", total)
		}
	}
}
