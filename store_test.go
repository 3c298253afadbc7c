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
	for _, good := range []string{"holder ü", "所有者", "a b", strings.Repeat("é", MaxOwnerLen/2)} {
		if err := ValidateOwner(good); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
	for _, bad := range []string{"", "a\x00b", "tab\t", "\xff\xfe", strings.Repeat("é", MaxOwnerLen/2+1)} {
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
	held := State{Epoch: 1, Generation: 5, Owner: "A", LeaseUntil: now.Add(time.Second), CurrentEpoch: 1, Now: now}
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
		{"epoch bumped, not yet acquired", State{Epoch: 1, Generation: 5, CurrentEpoch: 2, Now: now}, nil, CauseEpochBumped},
		{"epoch bumped after publishing", State{Epoch: 1, Generation: 5, PublishedGeneration: 5, CurrentEpoch: 2, Now: now}, pub, CauseEpochBumped},
		{"epoch bumped, generation lost in a restore", State{Epoch: 1, Generation: 3, CurrentEpoch: 2, Now: now}, pub, CauseEpochBumped},
		{"epoch bumped, then superseded", State{Epoch: 2, Generation: 6, Owner: "B", LeaseUntil: now.Add(time.Second), CurrentEpoch: 2, Now: now}, nil, CauseSuperseded},
		{"this owner's generation under a later epoch", State{Epoch: 2, Generation: 5, Owner: "A", LeaseUntil: now.Add(time.Second), CurrentEpoch: 2, Now: now}, pub, CauseEpochMismatch},
		{"another owner's generation under a later epoch", State{Epoch: 2, Generation: 5, Owner: "B", LeaseUntil: now.Add(time.Second), CurrentEpoch: 2, Now: now}, pub, CauseSuperseded},
		{"an epoch never reached", State{Epoch: 1, Generation: 5, Owner: "B", CurrentEpoch: 1, Now: now}, nil, CauseUnknown},
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

// TestClassifyWithEpochMismatch holds every cause to the truth when the lease's epoch differs
// from the row's or the store's, with epoch and generation kept apart (epoch 3, generation 5)
// so that neither can pass for the other. The lease presented is A's generation 5.
func TestClassifyWithEpochMismatch(t *testing.T) {
	now := time.Unix(1000, 0)
	live := now.Add(time.Second)
	pub := &driver.Publication{OpID: "op", SourceVersion: 7}
	cases := []struct {
		name    string
		epoch   int64 // presented
		st      State
		pub     *driver.Publication
		want    Cause
		wantMsg string
	}{
		// The case: the current holder presents an older epoch (the CLI's old default).
		{"holder, older epoch", 1, State{Epoch: 3, Generation: 5, Owner: "A", LeaseUntil: live, CurrentEpoch: 3}, pub,
			CauseEpochMismatch, "lease 1.5 names the wrong epoch: this owner acquired generation 5 in epoch 3 (token 3.5)"},
		{"holder, newer epoch", 4, State{Epoch: 3, Generation: 5, Owner: "A", LeaseUntil: live, CurrentEpoch: 3}, nil,
			CauseEpochMismatch, "lease 4.5 names the wrong epoch: this owner acquired generation 5 in epoch 3 (token 3.5)"},
		{"holder, older epoch, already published", 2, State{Epoch: 3, Generation: 5, Owner: "A", LeaseUntil: live, PublishedGeneration: 5, CurrentEpoch: 3}, pub,
			CauseEpochMismatch, "names the wrong epoch"},
		{"holder, older epoch, expired", 2, State{Epoch: 3, Generation: 5, Owner: "A", LeaseUntil: now, CurrentEpoch: 3}, nil,
			CauseEpochMismatch, "names the wrong epoch"},
		// A lease from before a bump: the bump freed it and nobody acquired since.
		{"bumped, released by the bump", 3, State{Epoch: 3, Generation: 5, CurrentEpoch: 4}, nil,
			CauseEpochBumped, "lease 3.5 was acquired before the epoch was bumped to 4"},
		{"bumped, already published", 3, State{Epoch: 3, Generation: 5, PublishedGeneration: 5, CurrentEpoch: 4}, pub,
			CauseEpochBumped, "lease 3.5 was acquired before the epoch was bumped to 4"},
		{"bumped, older source", 3, State{Epoch: 3, Generation: 5, SourceVersion: 9, CurrentEpoch: 4}, pub,
			CauseEpochBumped, "was acquired before the epoch was bumped to 4"},
		{"bumped twice", 3, State{Epoch: 3, Generation: 5, CurrentEpoch: 5}, nil,
			CauseEpochBumped, "was acquired before the epoch was bumped to 5"},
		// Someone acquired after the bump: a later token exists.
		{"bumped, then acquired", 3, State{Epoch: 4, Generation: 6, Owner: "B", LeaseUntil: live, CurrentEpoch: 4}, nil,
			CauseSuperseded, "lease 3.5 was superseded by lease 4.6"},
		{"bumped, then acquired with a restored generation", 3, State{Epoch: 4, Generation: 5, Owner: "B", LeaseUntil: live, CurrentEpoch: 4}, pub,
			CauseSuperseded, "lease 3.5 was superseded by lease 4.5"},
		{"superseded within the epoch", 3, State{Epoch: 3, Generation: 6, Owner: "B", LeaseUntil: live, CurrentEpoch: 3}, nil,
			CauseSuperseded, "lease 3.5 was superseded by lease 3.6"},
		// Same epoch everywhere, epoch != generation: the ordinary causes name the whole token.
		{"expired", 3, State{Epoch: 3, Generation: 5, Owner: "A", LeaseUntil: now, CurrentEpoch: 3}, nil,
			CauseExpired, "lease 3.5 has expired"},
		{"released", 3, State{Epoch: 3, Generation: 5, CurrentEpoch: 3}, nil,
			CauseReleased, "lease 3.5 was released"},
		{"already published", 3, State{Epoch: 3, Generation: 5, Owner: "A", LeaseUntil: live, PublishedGeneration: 5, CurrentEpoch: 3}, pub,
			CauseAlreadyPublished, "lease 3.5 has already published"},
		{"older source", 3, State{Epoch: 3, Generation: 5, Owner: "A", LeaseUntil: live, SourceVersion: 9, CurrentEpoch: 3}, pub,
			CauseStaleSource, "lease 3.5 carries a source version older than the published one"},
		// Tokens the row never issued.
		{"an epoch not reached", 5, State{Epoch: 3, Generation: 5, Owner: "B", LeaseUntil: live, CurrentEpoch: 3}, nil,
			CauseUnknown, "lease 5.5 is not current (the resource's latest acquisition is lease 3.5)"},
		{"a generation not reached", 3, State{Epoch: 3, Generation: 4, CurrentEpoch: 3}, nil,
			CauseUnknown, "lease 3.5 is not current (the resource's latest acquisition is lease 3.4)"},
	}
	for _, c := range cases {
		c.st.Now, c.st.Resource = now, "r"
		ref := driver.LeaseRef{Resource: "r", Owner: "A", Epoch: c.epoch, Generation: 5}
		got := classify(c.st, ref, c.pub)
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
			continue
		}
		e := &RefusedError{Op: "publish", Resource: "r", Epoch: ref.Epoch, Generation: ref.Generation, Cause: got,
			CurrentToken: Token{c.st.Epoch, c.st.Generation}, CurrentGeneration: c.st.Generation,
			CurrentEpoch: max(c.st.CurrentEpoch, c.st.Epoch)}
		if msg := e.Error(); !strings.Contains(msg, c.wantMsg) {
			t.Errorf("%s: message %q, want it to contain %q", c.name, msg, c.wantMsg)
		}
	}
}

// TestCausesAreTrue checks, over every small row and lease, that each cause classify names is
// true of what it read: a superseding token is greater than the refused one, a bumped epoch is
// greater than the lease's, a wrong epoch belongs to this very acquisition. The old classify
// reported "generation 1 was superseded by generation 1" after a bump, and fails here.
func TestCausesAreTrue(t *testing.T) {
	now := time.Unix(1000, 0)
	owners := []string{"", "A", "B"}
	for rowEpoch := int64(0); rowEpoch <= 3; rowEpoch++ {
		for rowGen := int64(0); rowGen <= 3; rowGen++ {
			for current := max(rowEpoch, 1); current <= 3; current++ {
				for _, owner := range owners {
					for refEpoch := int64(1); refEpoch <= 3; refEpoch++ {
						for refGen := int64(1); refGen <= 3; refGen++ {
							st := State{Epoch: rowEpoch, Generation: rowGen, Owner: owner, CurrentEpoch: current,
								LeaseUntil: now.Add(time.Second), Now: now}
							ref := driver.LeaseRef{Resource: "r", Owner: "A", Epoch: refEpoch, Generation: refGen}
							row, mine := Token{rowEpoch, rowGen}, Token{refEpoch, refGen}
							var wrong string
							switch c := classify(st, ref, nil); c {
							case CauseSuperseded:
								if row.Compare(mine) <= 0 {
									wrong = "the row's token is not later"
								}
							case CauseEpochBumped:
								if refEpoch >= current {
									wrong = "the store's epoch is not later"
								}
							case CauseEpochMismatch:
								if owner != "A" || rowGen != refGen || rowEpoch == refEpoch {
									wrong = "the row does not hold this owner's generation under another epoch"
								}
							case CauseReleased, CauseExpired:
								if row != mine || refEpoch != current {
									wrong = "the row's token is another lease's"
								}
							}
							if wrong != "" {
								t.Errorf("row %s (owner %q, store epoch %d), lease %s: %s",
									row, owner, current, mine, wrong)
							}
						}
					}
				}
			}
		}
	}
}

func TestErrorsMatchTheirSentinels(t *testing.T) {
	refused := &RefusedError{Op: "publish", Resource: "r", Epoch: 2, Generation: 3, Cause: CauseSuperseded,
		CurrentToken: Token{2, 4}, CurrentGeneration: 4, CurrentEpoch: 2}
	if !errors.Is(refused, ErrRefused) || errors.Is(refused, ErrNotProvisioned) || errors.Is(refused, ErrBusy) {
		t.Fatal("RefusedError matches the wrong sentinels")
	}
	if got := refused.Error(); got != `publish "r" refused: lease 2.3 was superseded by lease 2.4` {
		t.Fatalf("message: %s", got)
	}
	refused.Epoch = 0 // the caller did not know the epoch: the message names the generation only
	if got := refused.Error(); got != `publish "r" refused: generation 3 was superseded by lease 2.4` {
		t.Fatalf("message without an epoch: %s", got)
	}
	missing := &RefusedError{Op: "release", Resource: "r", Cause: CauseNotProvisioned}
	if !errors.Is(missing, ErrNotProvisioned) || !errors.Is(missing, ErrRefused) {
		t.Fatal("a refusal for a missing row must match ErrNotProvisioned and ErrRefused")
	}
	busy := &BusyError{Resource: "r", Token: Token{3, 2}, Generation: 2, LeaseUntil: time.Unix(0, 0)}
	if !errors.Is(busy, ErrBusy) || errors.Is(busy, ErrRefused) {
		t.Fatal("BusyError matches the wrong sentinels")
	}
	if got := busy.Error(); got != `resource "r" is busy: lease 3.2 is held until 1970-01-01T00:00:00Z` {
		t.Fatalf("busy message: %s", got)
	}
	if !errors.Is(invalid("ttl", "bad"), ErrInvalid) {
		t.Fatal("InvalidError does not match ErrInvalid")
	}
}

func TestParseToken(t *testing.T) {
	for in, want := range map[string]Token{"2.1": {2, 1}, "1.1": {1, 1}, "10.250": {10, 250},
		"9223372036854775807.9223372036854775807": {1<<63 - 1, 1<<63 - 1}} {
		got, err := ParseToken(in)
		if err != nil || got != want {
			t.Errorf("ParseToken(%q) = %v, %v; want %v", in, got, err, want)
		}
		if got.String() != in {
			t.Errorf("%q does not round-trip: %s", in, got)
		}
	}
	for in, reason := range map[string]string{
		"":                      "no dot",
		"2":                     "no dot",
		"2.":                    "the generation is missing",
		".1":                    "the epoch is missing",
		"0.1":                   `the epoch "0" is not a positive integer`,
		"2.0":                   `the generation "0" is not a positive integer`,
		"-1.1":                  `the epoch "-1" is not a positive integer`,
		"+2.1":                  `the epoch "+2" is not a positive integer`,
		"2.+1":                  `the generation "+1" is not a positive integer`,
		" 2.1":                  `the epoch " 2" is not a positive integer`,
		"2.1 ":                  `the generation "1 " is not a positive integer`,
		"2.1.3":                 `the generation "1.3" is not a positive integer`,
		"02.1":                  `the epoch "02" has a leading zero`,
		"2.x":                   `the generation "x" is not a positive integer`,
		"２.1":                   `the epoch "２" is not a positive integer`,
		"9223372036854775808.1": `the epoch "9223372036854775808" is too large`,
	} {
		_, err := ParseToken(in)
		var inv *InvalidError
		if !errors.As(err, &inv) || inv.Arg != "token" || !strings.Contains(inv.Reason, reason) {
			t.Errorf("ParseToken(%q) = %v; want an invalid token saying %q", in, err, reason)
		}
	}
}

// TestTokenStringOneAllocation: the token's text is built on the stack and copied once; the
// service writes one per answer. fmt.Sprintf took two (a generation past 255 is boxed).
func TestTokenStringOneAllocation(t *testing.T) {
	tok := Token{Epoch: 7, Generation: 1_000_000}
	if n := testing.AllocsPerRun(100, func() { _ = tok.String() }); n != 1 {
		t.Fatalf("Token.String: %v allocations, want 1", n)
	}
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"2.1", "0.0", "1.", "01.1", "9223372036854775808.1", "1.2.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: an error that is not ErrInvalid: %v", s, err)
			}
			return
		}
		if tok.Epoch < 1 || tok.Generation < 1 || tok.String() != s {
			t.Fatalf("%q parsed as %v", s, tok)
		}
	})
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
