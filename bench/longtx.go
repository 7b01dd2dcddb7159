package bench

import (
	"context"
	"time"
)

// LongTxConfig sizes a LongTx run. A nil or zero config works.
type LongTxConfig struct {
	// Slots of the worker, one process. Defaults to 16.
	Slots int
	// MaxConns of the worker's pool. Defaults to 8.
	MaxConns int
	// Processes is how many worker runtimes run, each of Slots slots with a
	// pool of MaxConns and a LISTEN connection of its own, as separate
	// processes would have: every notification wakes each of them. Defaults
	// to 1.
	Processes int
	// Rate of inserted rows per second, at a fixed pace. Defaults to 1,000
	// unless Depth is set.
	Rate float64
	// Depth selects the peak mode: instead of a fixed rate, the producer
	// keeps this many rows waiting to be started, so that the worker runs
	// as fast as it can. Defaults to 0 (a fixed rate).
	Depth int
	// Phase is the length of each phase: clean, idle-in-tx, recovery.
	// Defaults to 90s.
	Phase time.Duration
	// SampleEvery is the sampling interval. Defaults to 5s.
	SampleEvery time.Duration
	// Drain bounds the wait, after the last phase, for the rows still
	// waiting to be done. Defaults to 5m.
	Drain time.Duration
}

// LongTxResult is what LongTx measured: each phase's sums and the samples.
type LongTxResult struct {
	Setup
	Slots     int     `json:"slots"`
	MaxConns  int     `json:"max_conns"`
	Processes int     `json:"processes"`
	Rate      float64 `json:"rate"`  // 0 in peak mode
	Depth     int     `json:"depth"` // 0 at a fixed rate
	PhaseSec  float64 `json:"phase_sec"`
	// Rows is the rows inserted in all; every one ended done unless
	// Undrained says otherwise.
	Rows int64 `json:"rows"`
	// Undrained is the rows still not done when the wait for the backlog
	// gave up after the last phase (their outcomes were not checked).
	Undrained int64         `json:"undrained,omitempty"`
	Phases    []PhaseResult `json:"phases"`
	// HeldOverClean is the idle-in-tx phase's rows/s over the clean
	// phase's; RecoveryOverClean the recovery phase's.
	HeldOverClean     float64  `json:"held_over_clean"`
	RecoveryOverClean float64  `json:"recovery_over_clean"`
	Samples           []Sample `json:"samples"`
}

// LongTx reproduces a long transaction beside the queue: a producer at
// cfg.Rate rows per second (or keeping cfg.Depth rows waiting), a worker of
// cfg.Slots slots with a no-op handler, and three phases of cfg.Phase each:
// clean; idle-in-tx, where a REPEATABLE READ transaction on a connection of
// its own holds a snapshot open, pinning the xmin horizon so that no dead
// row of files.files can be removed; and recovery after it ended. It samples
// throughput, pickup times, depth and the table's dead tuples and sizes, and
// at the end waits for the backlog to drain and checks every row ended done.
func (b *Bench) LongTx(ctx context.Context, cfg *LongTxConfig) (*LongTxResult, error) {
	c := LongTxConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Slots = orDefault(c.Slots, 16)
	c.MaxConns = orDefault(c.MaxConns, 8)
	c.Processes = orDefault(c.Processes, 1)
	if c.Depth <= 0 {
		c.Rate = orDefault(c.Rate, 1000)
	} else {
		c.Rate = 0
	}
	c.Phase = orDefault(c.Phase, 90*time.Second)
	c.SampleEvery = orDefault(c.SampleEvery, 5*time.Second)
	c.Drain = orDefault(c.Drain, 5*time.Minute)
	out, err := b.steady(ctx, steadyConfig{
		mode: "long-tx", slots: c.Slots, maxConns: c.MaxConns, processes: c.Processes, rate: c.Rate, depth: c.Depth,
		sampleEvery: c.SampleEvery, drain: c.Drain,
		phases: []steadyPhase{
			{name: "clean", duration: c.Phase},
			{name: "idle-in-tx", duration: c.Phase, hold: true},
			{name: "recovery", duration: c.Phase},
		},
	})
	if err != nil {
		return nil, err
	}
	res := &LongTxResult{
		Setup: b.setup("long-tx"), Slots: c.Slots, MaxConns: c.MaxConns, Processes: c.Processes, Rate: c.Rate, Depth: c.Depth,
		PhaseSec: c.Phase.Seconds(), Rows: out.rows, Undrained: out.undrained, Phases: out.phases, Samples: out.samples,
	}
	if clean := out.phases[0].RowsPerSec; clean > 0 {
		res.HeldOverClean = round(out.phases[1].RowsPerSec/clean, 3)
		res.RecoveryOverClean = round(out.phases[2].RowsPerSec/clean, 3)
	}
	return res, nil
}
