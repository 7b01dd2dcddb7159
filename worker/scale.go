package worker

import (
	"context"
	"math"
	"slices"
)

// sqlBacklog counts the rows claimable now in the worker's queues, up to $2.
const sqlBacklog = `SELECT files.backlog($1::text[], $2::integer)`

// Scaling needs this many checks in a row (one per heartbeat) on the same
// side before it acts, so that a burst does not make the slots flap.
const (
	growAfter   = 2
	shrinkAfter = 3
)

// scale adds or removes slots between Slots and MaxSlots after a heartbeat.
// A process with no busy slot sends no query for it.
func (w *Worker) scale(ctx context.Context) {
	if w.stopping.Load() {
		return
	}
	w.mu.Lock()
	busy, slots := w.busy, len(w.ids)
	w.mu.Unlock()

	perBusy := 0.0
	if busy > 0 {
		limit := int(math.Ceil(w.threshold*float64(w.maxSlots))) + 1
		var backlog int64
		if err := w.pool.QueryRow(ctx, sqlBacklog, w.queues, limit).Scan(&backlog); err != nil {
			w.logger.Debug("worker: read the backlog for scaling", "error", err)
			return
		}
		perBusy = float64(backlog) / float64(busy)
	}

	w.mu.Lock()
	grow, shrink := 0, 0
	switch {
	case perBusy > w.threshold && busy*4 >= slots*3 && slots < w.maxSlots:
		w.below = 0
		if w.above++; w.above >= growAfter {
			w.above = 0
			grow = min(w.maxSlots-slots, max(1, slots/2))
		}
	case perBusy < w.threshold/2 && slots > w.minSlots:
		w.above = 0
		if w.below++; w.below >= shrinkAfter {
			w.below = 0
			shrink = min(slots-w.minSlots, max(1, slots/4))
		}
	default:
		w.above, w.below = 0, 0
	}
	w.mu.Unlock()

	switch {
	case grow > 0:
		w.grow(ctx, grow, perBusy)
	case shrink > 0:
		w.shrink(ctx, shrink, perBusy)
	}
}

func (w *Worker) grow(ctx context.Context, n int, perBusy float64) {
	w.mu.Lock()
	ids := w.newIDs(n)
	w.mu.Unlock()
	if err := w.register(ctx, ids); err != nil {
		w.logger.Debug("worker: register more slots", "error", err)
		return
	}
	w.mu.Lock()
	if w.stopping.Load() {
		// Too late: Stop deregisters what it sees, so hand these back now.
		w.mu.Unlock()
		w.deregister(ctx, ids)
		return
	}
	w.ids = append(w.ids, ids...)
	slots := len(w.ids)
	w.mu.Unlock()
	for _, id := range ids {
		w.claimer.Free(id)
	}
	w.logger.Info("worker: added slots", "added", n, "slots", slots, "backlog_per_busy_slot", perBusy)
}

func (w *Worker) shrink(ctx context.Context, n int, perBusy float64) {
	w.mu.Lock()
	// An idle slot may still hold a row whose outcome is on its way:
	// deregistering it would hand that row back.
	holding := make(map[string]bool, len(w.running))
	for _, t := range w.running {
		holding[t.row.WorkerID] = true
	}
	var gone []string
	for i := len(w.ids) - 1; i >= 0 && len(gone) < n && len(w.ids)-len(gone) > w.minSlots; i-- {
		if !holding[w.ids[i]] && w.claimer.Remove(w.ids[i]) {
			gone = append(gone, w.ids[i])
		}
	}
	w.ids = slices.DeleteFunc(w.ids, func(id string) bool { return slices.Contains(gone, id) })
	slots := len(w.ids)
	w.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	w.deregister(ctx, gone)
	w.logger.Info("worker: removed idle slots", "removed", len(gone), "slots", slots, "backlog_per_busy_slot", perBusy)
}
