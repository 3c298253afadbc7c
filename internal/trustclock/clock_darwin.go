package trustclock

import (
	"time"

	"golang.org/x/sys/unix"
)

// read is CLOCK_MONOTONIC, which on macOS goes on counting while the machine sleeps (Go's own
// monotonic readings come from a clock that does not).
func read() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("trustclock: CLOCK_MONOTONIC: " + err.Error())
	}
	return time.Duration(ts.Nano())
}
