package fenced

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

func TestValidResource(t *testing.T) {
	for _, ok := range []string{"r", "report:42", "ünïcødé/名前", strings.Repeat("x", MaxResourceLen)} {
		if err := validResource(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxResourceLen+1), "a\x00b", "tab\there", "\xff\xfe"} {
		if err := validResource(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", bad, err)
		}
	}
}

func TestValidOwner(t *testing.T) {
	if err := ValidateOwner(newID()); err != nil {
		t.Fatalf("a generated owner is invalid: %v", err)
	}
	for _, bad := range []string{"", "a b", "é", strings.Repeat("o", MaxOwnerLen+1)} {
		if err := ValidateOwner(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", bad, err)
		}
	}
}

func TestNewOwnerIsFresh(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		o := newID()
		if seen[o] {
			t.Fatalf("owner %s generated twice", o)
		}
		seen[o] = true
	}
}

func TestMargin(t *testing.T) {
	s := &Store{}
	if m, err := s.margin(10 * time.Second); err != nil || m != time.Second {
		t.Fatalf("default margin = %s, %v", m, err)
	}
	for _, ttl := range []time.Duration{0, -time.Second, time.Microsecond, MaxTTL + 1} {
		if _, err := s.margin(ttl); !errors.Is(err, ErrInvalid) {
			t.Errorf("ttl %s: %v, want ErrInvalid", ttl, err)
		}
	}
	s.cfg.SafetyMargin = time.Second
	if _, err := s.margin(time.Second); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a ttl no longer than the margin was accepted")
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{{MaxPayloadBytes: -1}, {SafetyMargin: -1}, {ReleaseTimeout: -1}} {
		if _, err := c.withDefaults(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", c, err)
		}
	}
	c, err := (*Config)(nil).withDefaults()
	if err != nil || c.MaxPayloadBytes != DefaultMaxPayloadBytes || c.ReleaseTimeout != DefaultReleaseTimeout || c.Logger == nil {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
}

func TestClassify(t *testing.T) {
	now := time.Unix(1000, 0)
	ref := driver.LeaseRef{Resource: "r", Owner: "A", Epoch: 1, Generation: 5}
	pub := &driver.Publication{OpID: "op", SourceVersion: 7}
	held := State{Epoch: 1, Generation: 5, Owner: "A", LeaseUntil: now.Add(time.Second), Now: now}
	cases := []struct {
		name string
		st   State
		pub  *driver.Publication
		want Cause
	}{
		{"newer generation", State{Epoch: 1, Generation: 6, Owner: "B", LeaseUntil: now.Add(time.Second), Now: now}, pub, CauseSuperseded},
		{"newer generation, not publishing", State{Epoch: 1, Generation: 7, Now: now}, nil, CauseSuperseded},
		{"already published", State{Epoch: 1, Generation: 5, Owner: "A", PublishedGeneration: 5, LeaseUntil: now.Add(time.Second), Now: now}, pub, CauseAlreadyPublished},
		{"published then released", State{Epoch: 1, Generation: 5, PublishedGeneration: 5, Now: now}, pub, CauseAlreadyPublished},
		{"released", State{Epoch: 1, Generation: 5, Now: now}, nil, CauseReleased},
		{"expired", State{Epoch: 1, Generation: 5, Owner: "A", LeaseUntil: now, Now: now}, pub, CauseExpired},
		{"other owner", State{Epoch: 1, Generation: 5, Owner: "X", LeaseUntil: now.Add(time.Second), Now: now}, pub, CauseUnknown},
		{"future generation", State{Epoch: 1, Generation: 4, Now: now}, pub, CauseUnknown},
		{"newer epoch, lower generation", State{Epoch: 2, Generation: 3, Now: now}, pub, CauseSuperseded},
		{"epoch bumped, not yet acquired", State{Epoch: 1, Generation: 5, CurrentEpoch: 2, Now: now}, nil, CauseSuperseded},
		{"older source", State{Epoch: 1, Generation: 5, Owner: "A", SourceVersion: 9, LeaseUntil: now.Add(time.Second), Now: now}, pub, CauseStaleSource},
		{"same source", State{Epoch: 1, Generation: 5, Owner: "A", SourceVersion: 7, LeaseUntil: now.Add(time.Second), Now: now}, pub, CauseUnknown},
		{"row matches after all", held, pub, CauseUnknown},
	}
	for _, c := range cases {
		if got := classify(c.st, ref, c.pub); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

func TestErrorsMatchTheirSentinels(t *testing.T) {
	refused := &RefusedError{Op: "publish", Resource: "r", Generation: 3, Cause: CauseSuperseded, CurrentGeneration: 4}
	if !errors.Is(refused, ErrRefused) || errors.Is(refused, ErrNotProvisioned) || errors.Is(refused, ErrBusy) {
		t.Fatal("RefusedError matches the wrong sentinels")
	}
	if got := refused.Error(); got != `publish "r" refused: generation 3 was superseded by generation 4` {
		t.Fatalf("message: %s", got)
	}
	missing := &RefusedError{Op: "release", Resource: "r", Cause: CauseNotProvisioned}
	if !errors.Is(missing, ErrNotProvisioned) || !errors.Is(missing, ErrRefused) {
		t.Fatal("a refusal for a missing row must match ErrNotProvisioned and ErrRefused")
	}
	busy := &BusyError{Resource: "r", Generation: 2, LeaseUntil: time.Unix(0, 0)}
	if !errors.Is(busy, ErrBusy) || errors.Is(busy, ErrRefused) {
		t.Fatal("BusyError matches the wrong sentinels")
	}
	if !errors.Is(invalid("ttl", "bad"), ErrInvalid) {
		t.Fatal("InvalidError does not match ErrInvalid")
	}
}

func TestTokenOrder(t *testing.T) {
	a, b, c := Token{1, 9}, Token{1, 10}, Token{2, 3}
	if a.Compare(b) >= 0 || b.Compare(c) >= 0 || a.Compare(c) >= 0 || c.Compare(a) <= 0 || b.Compare(b) != 0 {
		t.Fatal("tokens must order by epoch, then generation")
	}
	if c.String() != "2.3" {
		t.Fatalf("String = %s", c)
	}
}

func TestValidRole(t *testing.T) {
	for _, ok := range []string{"fenced_app", "A1", "_x"} {
		if err := validRole(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1abc", "a-b", "a b", `x"; DROP TABLE t; --`, strings.Repeat("r", 64)} {
		if err := validRole(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", bad, err)
		}
	}
}

func FuzzValidResource(f *testing.F) {
	for _, s := range []string{"", "r", "a\nb", "\xff", strings.Repeat("y", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := validResource(s)
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("%q: an error that is not ErrInvalid: %v", s, err)
		}
		if err == nil && (s == "" || len(s) > MaxResourceLen || strings.ContainsAny(s, "\x00\n\r\t")) {
			t.Fatalf("%q accepted", s)
		}
	})
}

// TestMaxTTLBoundsLeasesAndPruning: Config.MaxTTL refuses longer leases, and PruneOperations
// refuses an age below it plus PruneMargin before anything is sent (the store has no driver).
func TestMaxTTLBoundsLeasesAndPruning(t *testing.T) {
	s := &Store{cfg: Config{MaxTTL: time.Hour}}
	if _, err := s.margin(time.Hour + time.Millisecond); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ttl past MaxTTL: %v", err)
	}
	if s.MinPruneAge() != 25*time.Hour {
		t.Fatalf("MinPruneAge %s", s.MinPruneAge())
	}
	for _, age := range []time.Duration{0, time.Hour, 25*time.Hour - time.Nanosecond} {
		_, err := s.PruneOperations(context.Background(), age)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "could still arrive and be accepted") {
			t.Errorf("prune %s: %v", age, err)
		}
	}
	if (&Store{}).MinPruneAge() != MaxTTL+PruneMargin {
		t.Fatalf("default MinPruneAge %s", (&Store{}).MinPruneAge())
	}
	for _, bad := range []time.Duration{-time.Second, time.Microsecond, MaxTTL + 1} {
		if _, err := (&Config{MaxTTL: bad}).withDefaults(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Config.MaxTTL %s: %v", bad, err)
		}
	}
}
