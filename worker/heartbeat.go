package worker

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/pgworker/pgworker/claim"
	"github.com/pgworker/pgworker/internal/retry"
)

// heartbeatLoop sends one heartbeat statement per interval for all the
// slots, and one more when a cancellation hint asks for it.
func (w *Worker) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(w.heartbeat)
	defer t.Stop()
	var down time.Time
	for {
		hinted := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.beatNow:
			hinted = true
		}
		err := w.beat(ctx)
		for n := 1; n <= 10 && claim.RaceLost(err); n++ {
			// Under stricter isolation a concurrent complete can make the
			// heartbeat lose a race: that is not an outage, try again soon.
			if !retry.Sleep(ctx, time.Duration(n)*(2*time.Millisecond+rand.N(10*time.Millisecond))) {
				return
			}
			err = w.beat(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return
		case claim.RaceLost(err):
			w.heartbeatErrors.Add(1)
			w.logger.Debug("worker: heartbeat kept losing races; trying again next interval", "error", err)
		case err != nil:
			w.heartbeatErrors.Add(1)
			if down.IsZero() {
				down = time.Now()
				w.logger.Warn("worker: heartbeat failed; running rows will be reaped unless it recovers within the lease timeout",
					"lease_timeout", w.lease, "error", err)
			} else {
				w.logger.Debug("worker: heartbeat failed again", "error", err)
			}
		case !down.IsZero():
			w.logger.Info("worker: heartbeats recovered", "down_for", time.Since(down).Round(time.Millisecond))
			down = time.Time{}
		}
		if err == nil && !hinted && w.maxSlots > w.minSlots {
			w.scale(ctx)
		}
	}
}

// beat sends one heartbeat and reconciles its answer with the running rows:
// a row missing from it was lost, a row held there but unknown here is an
// orphan (a claim whose answer never arrived) and is released.
func (w *Worker) beat(ctx context.Context) error {
	sent := time.Now()
	// A slow heartbeat is fine as long as it lands well within the lease.
	qctx, cancel := context.WithTimeout(ctx, w.lease/2)
	defer cancel()
	rows, err := w.pool.Query(qctx, sqlHeartbeat, w.key, w.WorkerIDs())
	if err != nil {
		return err
	}
	held := map[int64]heldRow{}
	for rows.Next() {
		var h heldRow
		if err := rows.Scan(&h.workerID, &h.fileID, &h.attempt); err != nil {
			rows.Close()
			return err
		}
		held[h.fileID] = h
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	w.heartbeats.Add(1)

	var orphans []heldRow
	w.mu.Lock()
	for id, t := range w.running {
		h, ok := held[id]
		at, hinted := w.hinted[id]
		if hinted && at.Before(sent) {
			delete(w.hinted, id) // this answer is the database's word on the hint
		}
		if ok && h.workerID == t.row.WorkerID && int(h.attempt) == t.row.Attempt {
			delete(held, id)
			continue
		}
		// A row whose claim answered after the heartbeat was sent may be
		// missing legitimately, and one whose handler returned is settled by
		// its fenced call.
		if t.received.After(sent) || t.finishing || t.gone != nil {
			continue
		}
		if hinted {
			// Cancelled (or lost at the same moment): either way it is not ours.
			t.gone = ErrCancelled
			t.cancel(ErrCancelled)
			w.cancelled.Add(1)
			w.logger.Info("worker: row cancelled by an operator; stopping its handler", "file_id", id,
				"worker_id", t.row.WorkerID)
			continue
		}
		t.gone = ErrLeaseLost
		t.cancel(ErrLeaseLost)
		w.leaseLosses.Add(1)
		w.logger.Warn("worker: lease lost; cancelling the handler and discarding its outcome",
			"file_id", id, "attempt", t.row.Attempt, "worker_id", t.row.WorkerID)
	}
	// Held there, unknown here: suspect once, release the second time in a
	// row. While a claim is in flight its rows may be held there and not yet
	// delivered here, however slow its answer: suspect nothing then.
	suspects := make(map[heldRow]int, len(held))
	if w.claimer.InFlight() {
		held = nil
		suspects = w.suspects
	}
	for _, h := range held {
		if t := w.running[h.fileID]; t != nil {
			continue // the same row in another attempt: settled by fencing
		}
		if w.suspects[h] > 0 {
			orphans = append(orphans, h)
		} else {
			suspects[h] = 1
		}
	}
	w.suspects = suspects
	w.mu.Unlock()

	for _, h := range orphans {
		var ok bool
		// Its claim token never arrived: the slot's key releases it.
		err := w.pool.QueryRow(qctx, sqlRelease, h.fileID, h.workerID, h.attempt, w.key, "not known to its worker").Scan(&ok)
		if err != nil {
			return err
		}
		if ok {
			w.orphans.Add(1)
			w.logger.Warn("worker: released a row held by this process but unknown to it", "file_id", h.fileID,
				"worker_id", h.workerID)
		}
	}
	return nil
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
