package bench

import (
	"context"
	"time"
)

// SoakConfig sizes a Soak run. A nil or zero config works.
type SoakConfig struct {
	// Duration of the run. Defaults to 30m.
	Duration time.Duration
	// Rate of inserted rows per second. Defaults to 500.
	Rate float64
	// Slots of the worker, one process. Defaults to 16.
	Slots int
	// MaxConns of the worker's pool. Defaults to 8.
	MaxConns int
	// SampleEvery is the sampling interval. Defaults to 10s.
	SampleEvery time.Duration
	// PruneEvery calls files.prune at this interval (and once at the end),
	// as retention's pruner would; the database must have it. Defaults to
	// 0: no pruning by the benchmark (workers that prune by themselves
	// still do).
	PruneEvery time.Duration
	// Keep is, with PruneEvery, how long done rows of Queue are kept
	// (files.keep_queue) before files.prune deletes them. Defaults to 1m.
	Keep time.Duration
	// Drain bounds the wait, at the end, for the rows still waiting.
	// Defaults to 5m.
	Drain time.Duration
}

// SoakResult is what Soak measured: the samples over time, and the run
// summed up as one phase.
type SoakResult struct {
	Setup
	Slots       int     `json:"slots"`
	MaxConns    int     `json:"max_conns"`
	Rate        float64 `json:"rate"`
	DurationSec float64 `json:"duration_sec"`
	// PruneEverySec is the interval of files.prune calls (0: none),
	// KeepSec how long done rows were kept, PruneCalls how many calls
	// succeeded and PrunedRows the rows they deleted.
	PruneEverySec float64 `json:"prune_every_sec"`
	KeepSec       float64 `json:"keep_sec,omitempty"`
	PruneCalls    int64   `json:"prune_calls"`
	PrunedRows    int64   `json:"pruned_rows"`
	Rows          int64   `json:"rows"`
	// Undrained is the rows still not done when the wait for the backlog
	// gave up after the last phase (their outcomes were not checked).
	Undrained int64       `json:"undrained,omitempty"`
	Summary   PhaseResult `json:"summary"`
	Samples   []Sample    `json:"samples"`
}

// Soak runs a producer at cfg.Rate rows per second and a worker of
// cfg.Slots slots for cfg.Duration, sampling throughput, pickup times,
// depth and the table's sizes and dead tuples: a queue that lasts keeps
// these lines flat. bench/chart draws the samples.
func (b *Bench) Soak(ctx context.Context, cfg *SoakConfig) (*SoakResult, error) {
	c := SoakConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Duration = orDefault(c.Duration, 30*time.Minute)
	c.Rate = orDefault(c.Rate, 500)
	c.Slots = orDefault(c.Slots, 16)
	c.MaxConns = orDefault(c.MaxConns, 8)
	c.SampleEvery = orDefault(c.SampleEvery, 10*time.Second)
	c.Drain = orDefault(c.Drain, 5*time.Minute)
	c.Keep = orDefault(c.Keep, time.Minute)
	if c.PruneEvery <= 0 {
		c.Keep = 0
	}
	out, err := b.steady(ctx, steadyConfig{
		mode: "soak", slots: c.Slots, maxConns: c.MaxConns, rate: c.Rate,
		sampleEvery: c.SampleEvery, pruneEvery: c.PruneEvery, keep: c.Keep, drain: c.Drain,
		phases: []steadyPhase{{name: "soak", duration: c.Duration}},
	})
	if err != nil {
		return nil, err
	}
	return &SoakResult{
		Setup: b.setup("soak"), Slots: c.Slots, MaxConns: c.MaxConns, Rate: c.Rate, DurationSec: c.Duration.Seconds(),
		PruneEverySec: c.PruneEvery.Seconds(), KeepSec: c.Keep.Seconds(), PruneCalls: out.pruned, PrunedRows: out.deleted,
		Rows: out.rows, Undrained: out.undrained, Summary: out.phases[0], Samples: out.samples,
	}, nil
}
