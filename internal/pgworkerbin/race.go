//go:build race

package pgworkerbin

const raceEnabled = true
