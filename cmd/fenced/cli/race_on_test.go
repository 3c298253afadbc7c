//go:build race

package cli_test

// raceEnabled builds the binary under test with the race detector when the tests run with it.
const raceEnabled = true
