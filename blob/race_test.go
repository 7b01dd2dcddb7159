//go:build race

package blob_test

// raceEnabled tells the memory test that the race detector's shadow memory
// inflates the figures.
const raceEnabled = true
