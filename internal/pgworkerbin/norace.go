//go:build !race

package pgworkerbin

const raceEnabled = false
