package fenced

import (
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
	if err := validOwner(newOwner()); err != nil {
		t.Fatalf("a generated owner is invalid: %v", err)
	}
	for _, bad := range []string{"", "a b", "é", strings.Repeat("o", MaxOwnerLen+1)} {
		if err := validOwner(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", bad, err)
		}
	}
}

func TestNewOwnerIsFresh(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		o := newOwner()
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
	ref := driver.LeaseRef{Resource: "r", Owner: "A", Generation: 5}
	held := State{Generation: 5, Owner: "A", LeaseUntil: now.Add(time.Second), Now: now}
	cases := []struct {
		name       string
		st         State
		publishing bool
		want       Cause
	}{
		{"newer generation", State{Generation: 6, Owner: "B", LeaseUntil: now.Add(time.Second), Now: now}, true, CauseSuperseded},
		{"newer generation, not publishing", State{Generation: 7, Now: now}, false, CauseSuperseded},
		{"already published", State{Generation: 5, Owner: "A", PublishedGeneration: 5, LeaseUntil: now.Add(time.Second), Now: now}, true, CauseAlreadyPublished},
		{"published then released", State{Generation: 5, PublishedGeneration: 5, Now: now}, true, CauseAlreadyPublished},
		{"released", State{Generation: 5, Now: now}, false, CauseReleased},
		{"expired", State{Generation: 5, Owner: "A", LeaseUntil: now, Now: now}, true, CauseExpired},
		{"other owner", State{Generation: 5, Owner: "X", LeaseUntil: now.Add(time.Second), Now: now}, true, CauseUnknown},
		{"future generation", State{Generation: 4, Now: now}, true, CauseUnknown},
		{"row matches after all", held, true, CauseUnknown},
	}
	for _, c := range cases {
		if got := classify(c.st, ref, c.publishing); got != c.want {
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
