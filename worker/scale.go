package worker

import (
	"context"
	"log/slog"
	"math"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
)

// sqlBacklog counts the rows claimable now in the worker's queues, up to $2.
const sqlBacklog = `SELECT files.backlog($1::text[], $2::integer)`

// Scaling needs this many checks in a row (one per heartbeat) on the same
// side before it acts, so that a burst does not make the slots flap.
const (
	growAfter   = 2
	shrinkAfter = 3
)

// scaler adds and removes slots between a least and a most number after
// each heartbeat, following the claimable backlog per busy slot. Its check
// runs on the heartbeat's goroutine only.
type scaler struct {
	pool      *pgxpool.Pool
	slots     scaledSlots
	logger    *slog.Logger
	queues    []string
	least     int     // slots it keeps
	most      int     // slots it may have
	threshold float64 // backlog per busy slot above which it grows

	above int // consecutive checks above the threshold
	below int // consecutive checks below half of it
}

// scaledSlots is what the scaler needs from the Worker.
type scaledSlots interface {
	// load returns the busy slots and all slots; ok is false once the
	// worker stops.
	load() (busy, slots int, ok bool)
	// addSlots registers n more slots and lets them claim. It returns the
	// number of slots then, or 0 when the worker stopped meanwhile.
	addSlots(ctx context.Context, n int) (slots int, err error)
	// removeIdleSlots deregisters up to n slots that hold no row, keeping at
	// least keep, and returns how many it removed and the number of slots.
	removeIdleSlots(ctx context.Context, n, keep int) (removed, slots int)
}

// newScaler returns a scaler of slots between least and most.
func newScaler(pool *pgxpool.Pool, slots scaledSlots, logger *slog.Logger, queues []string, least, most int, threshold float64) *scaler {
	return &scaler{pool: pool, slots: slots, logger: logger, queues: queues, least: least, most: most, threshold: threshold}
}

// check adds or removes slots after a heartbeat. A process with no busy
// slot sends no query for it.
func (s *scaler) check(ctx context.Context) {
	busy, slots, ok := s.slots.load()
	if !ok {
		return
	}
	perBusy := 0.0
	if busy > 0 {
		limit := int(math.Ceil(s.threshold*float64(s.most))) + 1
		var backlog int64
		if err := s.pool.QueryRow(ctx, sqlBacklog, s.queues, limit).Scan(&backlog); err != nil {
			s.logger.Debug("worker: read the backlog for scaling", "error", err)
			return
		}
		perBusy = float64(backlog) / float64(busy)
	}
	grow, shrink := s.decide(busy, slots, perBusy)
	switch {
	case grow > 0:
		s.grow(ctx, grow, perBusy)
	case shrink > 0:
		s.shrink(ctx, shrink, perBusy)
	}
}

// decide returns how many slots to add or to remove, once the backlog per
// busy slot has stayed on one side long enough.
func (s *scaler) decide(busy, slots int, perBusy float64) (grow, shrink int) {
	switch {
	case perBusy > s.threshold && busy*4 >= slots*3 && slots < s.most:
		s.below = 0
		if s.above++; s.above >= growAfter {
			s.above = 0
			grow = min(s.most-slots, max(1, slots/2))
		}
	case perBusy < s.threshold/2 && slots > s.least:
		s.above = 0
		if s.below++; s.below >= shrinkAfter {
			s.below = 0
			shrink = min(slots-s.least, max(1, slots/4))
		}
	default:
		s.above, s.below = 0, 0
	}
	return grow, shrink
}

func (s *scaler) grow(ctx context.Context, n int, perBusy float64) {
	slots, err := s.slots.addSlots(ctx, n)
	switch {
	case err != nil:
		s.logger.Debug("worker: register more slots", "error", err)
	case slots > 0:
		s.logger.Info("worker: added slots", "added", n, "slots", slots, "backlog_per_busy_slot", perBusy)
	}
}

func (s *scaler) shrink(ctx context.Context, n int, perBusy float64) {
	removed, slots := s.slots.removeIdleSlots(ctx, n, s.least)
	if removed > 0 {
		s.logger.Info("worker: removed idle slots", "removed", removed, "slots", slots, "backlog_per_busy_slot", perBusy)
	}
}

// load returns the busy slots and all slots, and false once the worker
// stops: then the slots no longer change.
func (w *Worker) load() (busy, slots int, ok bool) {
	if w.stopping.Load() {
		return 0, 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.busy, len(w.ids), true
}

// addSlots registers n more slots and lets them claim; it returns the number
// of slots then, or 0 when the worker stopped meanwhile.
func (w *Worker) addSlots(ctx context.Context, n int) (int, error) {
	w.mu.Lock()
	ids := w.newIDs(n)
	w.mu.Unlock()
	if err := w.register(ctx, ids); err != nil {
		return 0, err
	}
	w.mu.Lock()
	if w.stopping.Load() {
		// Too late: Stop deregisters what it sees, so hand these back now.
		w.mu.Unlock()
		w.deregister(ctx, ids)
		return 0, nil
	}
	w.ids = append(w.ids, ids...)
	slots := len(w.ids)
	w.mu.Unlock()
	for _, id := range ids {
		w.claimer.Free(id)
	}
	return slots, nil
}

// removeIdleSlots deregisters up to n of the last slots that hold no row,
// keeping at least keep slots.
func (w *Worker) removeIdleSlots(ctx context.Context, n, keep int) (removed, slots int) {
	w.mu.Lock()
	// An idle slot may still hold a row whose outcome is on its way:
	// deregistering it would hand that row back.
	holding := make(map[string]bool, len(w.running))
	for _, t := range w.running {
		holding[t.row.WorkerID] = true
	}
	var gone []string
	for i := len(w.ids) - 1; i >= 0 && len(gone) < n && len(w.ids)-len(gone) > keep; i-- {
		if !holding[w.ids[i]] && w.claimer.Remove(w.ids[i]) {
			gone = append(gone, w.ids[i])
		}
	}
	w.ids = slices.DeleteFunc(w.ids, func(id string) bool { return slices.Contains(gone, id) })
	slots = len(w.ids)
	w.mu.Unlock()
	if len(gone) == 0 {
		return 0, slots
	}
	w.deregister(ctx, gone)
	return len(gone), slots
}
