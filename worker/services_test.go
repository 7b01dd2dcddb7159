package worker

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"
)

// The scaler acts only after a streak of checks on one side, and by steps
// that keep the slots between its bounds.
func TestScalerDecide(t *testing.T) {
	type check struct {
		busy, slots  int
		perBusy      float64
		grow, shrink int
	}
	for _, tc := range []struct {
		name   string
		checks []check
	}{
		{"grows by half after two checks above", []check{
			{busy: 4, slots: 4, perBusy: 5},
			{busy: 4, slots: 4, perBusy: 5, grow: 2},
			{busy: 6, slots: 6, perBusy: 5},
			{busy: 6, slots: 6, perBusy: 5, grow: 2}, // up to most
			{busy: 8, slots: 8, perBusy: 5},
			{busy: 8, slots: 8, perBusy: 5},
		}},
		{"a check in between breaks the streak", []check{
			{busy: 4, slots: 4, perBusy: 5},
			{busy: 4, slots: 4, perBusy: 0.8},
			{busy: 4, slots: 4, perBusy: 5},
			{busy: 4, slots: 4, perBusy: 5, grow: 2},
		}},
		{"does not grow while a quarter of the slots idles", []check{
			{busy: 2, slots: 4, perBusy: 5},
			{busy: 2, slots: 4, perBusy: 5},
			{busy: 2, slots: 4, perBusy: 5},
		}},
		{"shrinks by a quarter after three checks below half", []check{
			{busy: 0, slots: 8, perBusy: 0},
			{busy: 0, slots: 8, perBusy: 0},
			{busy: 0, slots: 8, perBusy: 0, shrink: 2},
			{busy: 0, slots: 6, perBusy: 0},
			{busy: 0, slots: 6, perBusy: 0.4},
			{busy: 0, slots: 6, perBusy: 0, shrink: 1},
			{busy: 0, slots: 5, perBusy: 0},
			{busy: 0, slots: 5, perBusy: 0},
			{busy: 0, slots: 5, perBusy: 0, shrink: 1},
		}},
		{"keeps the least", []check{
			{busy: 0, slots: 2, perBusy: 0},
			{busy: 0, slots: 2, perBusy: 0},
			{busy: 0, slots: 2, perBusy: 0},
			{busy: 0, slots: 2, perBusy: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScaler(nil, nil, slog.New(slog.DiscardHandler), nil, 2, 8, 1)
			for i, c := range tc.checks {
				grow, shrink := s.decide(c.busy, c.slots, c.perBusy)
				if grow != c.grow || shrink != c.shrink {
					t.Fatalf("check %d (%+v): grow %d, shrink %d", i, c, grow, shrink)
				}
			}
		})
	}
}

// settlements records what a recorder settles, in order.
type settlements struct {
	ids     []int64
	answers []recorded
}

func (s *settlements) finish(o *outcome, r recorded) {
	s.ids = append(s.ids, o.t.row.ID)
	s.answers = append(s.answers, r)
}

func (s *settlements) wakeAt(time.Time) {}

// The recorder takes its batches in order of submission, at most maxBatch at
// a time; when it stops, it gives up what is still queued and what comes
// later, each once.
func TestRecorderQueue(t *testing.T) {
	var s settlements
	r := newRecorder(nil, &s, slog.New(slog.DiscardHandler), time.Second, 2)
	submit := func(id int64) {
		o := &outcome{t: &task{}}
		o.t.row.ID = id
		r.submit(o)
	}
	for id := range int64(5) {
		submit(id)
	}
	var batch []*outcome
	for _, want := range [][]int64{{0, 1}, {2, 3}} {
		batch = r.next(batch)
		var got []int64
		for _, o := range batch {
			got = append(got, o.t.row.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("batch %v, want %v", got, want)
		}
	}
	if len(s.ids) != 0 {
		t.Fatalf("settled %v before any answer", s.ids)
	}

	<-r.bell // rung by the submissions: run then sees only that ctx has ended
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.run(ctx)
	submit(5)
	if want := []int64{4, 5}; !slices.Equal(s.ids, want) {
		t.Fatalf("given up %v, want %v", s.ids, want)
	}
	for i, a := range s.answers {
		if a != recordedGaveUp {
			t.Fatalf("outcome %d settled with %d, want recordedGaveUp", s.ids[i], a)
		}
	}
	if batch = r.next(batch); len(batch) != 0 {
		t.Fatalf("%d outcomes left queued", len(batch))
	}
}
