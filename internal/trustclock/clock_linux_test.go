package trustclock

import (
	"testing"

	"golang.org/x/sys/unix"
)

// On Linux the clock is CLOCK_BOOTTIME: it reads between two readings of that clock, and it is
// never behind CLOCK_MONOTONIC, which it equals plus the time spent suspended.
func TestReadsBoottime(t *testing.T) {
	var before, mono, after unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &before); err != nil {
		t.Fatal(err)
	}
	got := read()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono); err != nil {
		t.Fatal(err)
	}
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &after); err != nil {
		t.Fatal(err)
	}
	if got.Nanoseconds() < before.Nano() || got.Nanoseconds() > after.Nano() {
		t.Fatalf("read %d is not between two CLOCK_BOOTTIME readings %d and %d", got, before.Nano(), after.Nano())
	}
	if after.Nano() < mono.Nano() {
		t.Fatalf("CLOCK_BOOTTIME %d behind CLOCK_MONOTONIC %d", after.Nano(), mono.Nano())
	}
}
