package worker

import "context"

// Gate tells whether the node can take rows, for example whether its work
// directory has room (see Config.Gate).
type Gate interface {
	// Open reports whether the node can take rows now. It is called each
	// time a slot's row ends, so it must be cheap.
	Open() bool
	// Wait returns nil once the node can take rows again, or ctx's error.
	Wait(ctx context.Context) error
}

// holdSlots keeps the slot id, and every slot idle at the time, from
// claiming until the gate opens: a node that cannot work leaves the rows
// to the other nodes instead of claiming them only to hand them back.
func (w *Worker) holdSlots(id string) {
	w.gated.Add(1)
	go func() {
		defer w.gated.Done()
		held := []string{id}
		for _, other := range w.WorkerIDs() {
			if other != id && w.claimer.Remove(other) {
				held = append(held, other)
			}
		}
		w.logger.Debug("worker: slots wait for the gate before claiming", "slots", len(held))
		if w.gate.Wait(w.loopCtx) != nil || w.closing.Load() {
			return
		}
		for _, id := range held {
			w.claimer.Free(id)
		}
	}()
}
