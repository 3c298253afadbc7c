package fenced

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/backend/sqlite"
)

// TestRenewAfterTrustEndedStaysLost holds Renew to its comment: once Done has closed, a
// renewal the database accepts (its lease had not expired yet) changes neither Err nor
// TrustUntil: a lost lease stays lost locally. The safety margin is most of the TTL, so that
// the database's lease outlives the trust window long enough for the renewal to arrive.
func TestRenewAfterTrustEndedStaysLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, err := sqlite.Open(filepath.Join(t.TempDir(), "trust.db"))
	if err != nil {
		t.Fatal(err)
	}
	const ttl, margin = 10 * time.Second, 9500 * time.Millisecond
	s, err := New(ctx, d, &Config{SafetyMargin: margin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "r", ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(ctx) })
	select {
	case <-l.Done():
	case <-time.After(time.Minute):
		t.Fatal("the trust window never ended")
	}
	lost, trustUntil, leaseUntil := l.Err(), l.TrustUntil(), l.LeaseUntil()
	if lost == nil {
		t.Fatal("Done closed with a nil Err")
	}
	if err := l.Renew(ctx, ttl); err != nil {
		t.Fatalf("the database refused a renewal before its expiry: %v", err)
	}
	if !l.LeaseUntil().After(leaseUntil) {
		t.Fatalf("the renewal did not move the database's lease: %s, before %s", l.LeaseUntil(), leaseUntil)
	}
	// TrustUntil is read from the clocks at each call: two calls differ by the microseconds
	// between the readings, a window restarted by the renewal by seconds.
	if d := l.TrustUntil().Sub(trustUntil); l.Err() != lost || d > time.Millisecond || d < -time.Millisecond {
		t.Fatalf("a renewal after Done changed the local state: Err %v (was %v), TrustUntil %s (was %s)",
			l.Err(), lost, l.TrustUntil(), trustUntil)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done reopened")
	}
}
