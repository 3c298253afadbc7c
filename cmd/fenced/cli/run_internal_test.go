package cli

import (
	"strings"
	"testing"
	"time"
)

// TestRunGrace: the default grace is half the safety margin (TTL/10), at most 10s, so that
// SIGKILL comes before the database's expiry; an explicit grace longer than the margin is a
// usage error naming both. The old default, 10s whatever the TTL, ran 7s past a 30s lease.
func TestRunGrace(t *testing.T) {
	for _, c := range []struct {
		ttl, grace time.Duration
		set        bool
		want       time.Duration
		err        string
	}{
		{ttl: 30 * time.Second, want: 1500 * time.Millisecond},
		{ttl: 10 * time.Minute, want: 10 * time.Second},
		{ttl: time.Second, want: 50 * time.Millisecond},
		{ttl: 30 * time.Second, grace: 3 * time.Second, set: true, want: 3 * time.Second},
		{ttl: 30 * time.Second, grace: 10 * time.Second, set: true,
			err: "--grace 10s is longer than the safety margin 3s of --ttl 30s"},
		{ttl: 30 * time.Second, grace: 0, set: true, err: "must be positive"},
	} {
		got, err := runGrace(c.ttl, c.grace, c.set)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || exitCode(err) != ExitUsage {
				t.Errorf("ttl %s grace %s: %v (exit %d), want a usage error saying %q", c.ttl, c.grace, err, exitCode(err), c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ttl %s grace %s set %v: %s, %v; want %s", c.ttl, c.grace, c.set, got, err, c.want)
		}
	}
}
