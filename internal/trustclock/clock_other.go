//go:build !linux && !darwin

package trustclock

import "time"

// start anchors read's readings.
var start = time.Now()

// read is Go's monotonic clock: on these systems no suspend-counting clock is read, and a
// suspend may pause the trust window (README: what the fence does and does not cover).
func read() time.Duration { return time.Since(start) }
