package etcd

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// The publish Txn relies on bytewise order of fixed-width values matching numeric order.
func TestEncodedGenerationsOrderLikeNumbers(t *testing.T) {
	gens := []int64{0, 1, 9, 10, 99, 100, 12345, 1 << 40, math.MaxInt64 - 1, math.MaxInt64}
	for i, a := range gens {
		for _, b := range gens[i+1:] {
			if encodeGen(a) >= encodeGen(b) {
				t.Fatalf("encodeGen(%d) >= encodeGen(%d)", a, b)
			}
			// A publication at a is below generation b; at b it is not below b.
			pubA := encodePub(a, 7, time.Now(), 3)
			if pubA >= encodeGen(b) {
				t.Fatalf("pub at %d not < gen %d", a, b)
			}
			if encodePub(b, 7, time.Now(), 3) < encodeGen(b) {
				t.Fatalf("pub at %d < gen %d", b, b)
			}
			if b < math.MaxInt64 && encodePub(b, 7, time.Now(), 3) >= encodeGen(b+1) {
				t.Fatalf("pub at %d not < gen %d", b, b+1)
			}
		}
		if got, err := decodeGen([]byte(encodeGen(a))); err != nil || got != a {
			t.Fatalf("decodeGen(encodeGen(%d)) = %d, %v", a, got, err)
		}
	}
	for _, bad := range []string{"", "1", "-0000000000000000001", strings.Repeat("x", genWidth)} {
		if _, err := decodeGen([]byte(bad)); err == nil {
			t.Errorf("decodeGen(%q) succeeded", bad)
		}
	}
}

func TestPublicationRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	p, err := decodePub([]byte(encodePub(42, 3, at, 1000)))
	if err != nil || p.generation != 42 || p.epoch != 3 || !p.at.Equal(at) || p.size != 1000 {
		t.Fatalf("round trip: %+v, %v", p, err)
	}
	if p, err := decodePub([]byte(encodeGen(0))); err != nil || p.generation != 0 || !p.at.IsZero() {
		t.Fatalf("provisioned: %+v, %v", p, err)
	}
	for _, bad := range []string{"", "x y", encodeGen(1) + " 1 x 1", encodeGen(1) + " 1 1", encodeGen(1) + " 1 2 3 4"} {
		if _, err := decodePub([]byte(bad)); err == nil {
			t.Errorf("decodePub(%q) succeeded", bad)
		}
	}
}

func TestTTLRoundsUpToWholeSeconds(t *testing.T) {
	for ttl, want := range map[time.Duration]int64{
		time.Millisecond: 1, time.Second: 1, time.Second + time.Nanosecond: 2,
		90 * time.Second: 90, fenced.MaxTTL: int64(fenced.MaxTTL / time.Second),
	} {
		if got := ttlSeconds(ttl); got != want {
			t.Errorf("ttlSeconds(%s) = %d, want %d", ttl, got, want)
		}
	}
}

func TestOpenRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"", "http://127.0.0.1:2379", "etcd://", "etcd://a:1,,b:2", "etcd:///x", "%"} {
		if d, err := Open(u); err == nil {
			_ = d.Close()
			t.Errorf("Open(%q) succeeded", u)
		}
	}
}

func TestOpenURLPrefix(t *testing.T) {
	d := openDriver(t, cluster.endpoints(), "/p/q/")
	if d.prefix != "/p/q/" || !d.owned {
		t.Fatalf("prefix %q owned %v", d.prefix, d.owned)
	}
	if d := New(d.cli, nil); d.prefix != DefaultPrefix || d.maxPayload != DefaultMaxPayloadBytes || d.Close() != nil {
		t.Fatalf("defaults: %+v", d)
	}
}

// A payload over the driver's limit fails before anything is sent and changes nothing: the store
// learns the driver's limit (driver.PayloadLimiter) and refuses it as invalid input, and the
// driver itself refuses it with ErrPayloadTooLarge; never as a refusal of the lease.
func TestPayloadOverDriverLimit(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	d := New(newClient(t, cluster.endpoints()), &Options{Prefix: prefix, MaxPayloadBytes: 1000})
	s, err := fenced.New(ctx, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "r", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, publish := range []func() error{
		func() error { return l.Publish(ctx, make([]byte, 1001)) },
		func() error { return l.PublishAndRelease(ctx, make([]byte, 1001)) },
	} {
		err := publish()
		if !errors.Is(err, fenced.ErrInvalid) || errors.Is(err, fenced.ErrRefused) {
			t.Fatalf("publish over the limit: %v, want ErrInvalid", err)
		}
	}
	if s.MaxPayloadBytes() != 1000 {
		t.Fatalf("the store's limit is %d, want the driver's 1000", s.MaxPayloadBytes())
	}
	ref := driver.LeaseRef{Resource: "r", Owner: l.Owner(), Epoch: l.Epoch(), Generation: l.Generation()}
	if _, err := d.Publish(ctx, ref, driver.Publication{Payload: make([]byte, 1001), OpID: "op"}); !errors.Is(err, ErrPayloadTooLarge) || !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("driver publish over the limit: %v, want ErrPayloadTooLarge", err)
	}
	st, err := s.Show(ctx, "r")
	if err != nil || st.PublishedGeneration != 0 || !st.Held() {
		t.Fatalf("after refused payloads: %+v, %v", st, err)
	}
	if err := l.PublishAndRelease(ctx, make([]byte, 1000)); err != nil {
		t.Fatalf("publish at the limit: %v", err)
	}
}

// Past the cluster's --max-request-bytes (here also past the client's 2 MiB send limit) the Txn
// is rejected: an operational error, never a refusal.
func TestPayloadOverClusterLimitIsAnError(t *testing.T) {
	ctx := testCtx(t)
	d := New(newClient(t, cluster.endpoints()), &Options{Prefix: newPrefix(), MaxPayloadBytes: 8 << 20})
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, "r", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := d.Publish(ctx, driver.LeaseRef{Resource: "r", Owner: "o", Epoch: g.Epoch, Generation: g.Generation},
		driver.Publication{Payload: make([]byte, testMaxRequestBytes), OpID: "op"})
	if err == nil || ok {
		t.Fatalf("publish past the cluster's request limit: ok=%v err=%v, want an error", ok, err)
	}
	// Rejected before it was applied (by the client's send limit or etcd's request limit).
	if !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("publish past the request limit: %v, want not applied", err)
	}
}

// TestKeysInOneAllocation: keys builds the five keys of a resource as slices of one string,
// equal to the plain concatenations, for names with spaces, non-ASCII and NUL; encodeHeld
// allocates once too.
func TestKeysInOneAllocation(t *testing.T) {
	d := &Driver{prefix: "/fenced ä/"}
	for _, r := range []string{"", "a", "ресурс\x00 with space", "x/gen"} {
		base := d.prefix + r + "/"
		want := keys{gen: base + "gen", owner: base + "owner", pub: base + "pub", source: base + "source", payload: base + "payload"}
		if got := d.keys(r); got != want {
			t.Errorf("keys(%q) = %q, want %q", r, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = d.keys("ресурс") }); n != 1 {
		t.Errorf("keys allocates %v times, want 1", n)
	}
	until := time.Unix(0, 1_764_000_100_000_000_123)
	if n := testing.AllocsPerRun(100, func() { _ = encodeHeld(1_764_000_000_123_456, 7, "owner ö", until) }); n != 1 {
		t.Errorf("encodeHeld allocates %v times, want 1", n)
	}
}
