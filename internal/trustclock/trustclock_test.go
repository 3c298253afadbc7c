package trustclock

import (
	"testing"
	"time"
)

// A Timer whose deadline passes during a suspend fires at the watch's next look, not when
// Go's clock, which did not count the suspend, would reach it. The mutant that never brings
// the pending Timers up to date (the look's loop removed) fails: the Timer is an hour away
// on Go's clock.
func TestTimerFiresAfterASuspend(t *testing.T) {
	fired := make(chan struct{})
	tm := AfterFunc(Now()+time.Hour, func() { close(fired) })
	defer tm.Stop()
	Suspend(2 * time.Hour)
	Look()
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("a Timer whose deadline passed during a suspend did not fire at the next look")
	}
}

// Without a suspend a look changes nothing: a Timer an hour away stays pending, and its
// function runs once it is reset to a deadline that has passed.
func TestLookWithoutASuspend(t *testing.T) {
	fired := make(chan struct{}, 2)
	tm := AfterFunc(Now()+time.Hour, func() { fired <- struct{}{} })
	Look()
	select {
	case <-fired:
		t.Fatal("a look without a suspend fired a Timer an hour away")
	default:
	}
	tm.Reset(Now())
	<-fired
	tm.Stop()
	select {
	case <-fired:
		t.Fatal("the function ran twice")
	default:
	}
}

// The watch stops looking once no Timer is pending, so that a process without leases has
// nothing waking it.
func TestWatchStopsWhenIdle(t *testing.T) {
	tm := AfterFunc(Now()+time.Hour, func() {})
	tm.Stop()
	Look()
	watch.mu.Lock()
	defer watch.mu.Unlock()
	if len(watch.timers) != 0 || watch.look != nil {
		t.Fatalf("after the last Timer stopped: %d pending, looking %v", len(watch.timers), watch.look != nil)
	}
}

// A Reset that comes after the Go timer of the earlier deadline fired, but before that run
// began, replaces the run: the run of the earlier arming, when it gets the lock, calls
// nothing, and the Timer stays watched until its new deadline. The test calls the earlier
// arming's run itself after the Reset, which is that schedule.
func TestResetReplacesAFiredRun(t *testing.T) {
	runs := make(chan struct{}, 2)
	tm := AfterFunc(Now()+time.Hour, func() { runs <- struct{}{} })
	defer tm.Stop()
	watch.mu.Lock()
	earlier := tm.armed
	watch.mu.Unlock()
	tm.Reset(Now() + 2*time.Hour)
	tm.fire(earlier)
	watch.mu.Lock()
	_, watched := watch.timers[tm]
	watch.mu.Unlock()
	if len(runs) != 0 || !watched {
		t.Fatalf("the earlier arming's run after a Reset: %d runs, watched %v; want none, and watched", len(runs), watched)
	}
}

// The watch looks by itself while a Timer is pending: after a suspend, the Timer fires within
// about a second without anyone calling Look (the bound below is generous for a loaded
// machine; the watch's own period is one second). The mutant whose watch never starts its
// looks leaves the Timer an hour away.
func TestWatchLooksByItself(t *testing.T) {
	fired := make(chan struct{})
	tm := AfterFunc(Now()+time.Hour, func() { close(fired) })
	defer tm.Stop()
	Suspend(2 * time.Hour)
	select {
	case <-fired:
	case <-time.After(10 * every):
		t.Fatal("no look of the watch fired a Timer whose deadline a suspend had passed")
	}
}
