package trustclock

import (
	"time"

	"golang.org/x/sys/unix"
)

// read is CLOCK_BOOTTIME: CLOCK_MONOTONIC plus the time the machine spent suspended.
func read() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic("trustclock: CLOCK_BOOTTIME: " + err.Error()) // in every kernel since 2.6.39
	}
	return time.Duration(ts.Nano())
}
