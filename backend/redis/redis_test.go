package redis_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/url"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serverURL is the Redis server the tests use: FENCED_TEST_REDIS, else the local default.
func serverURL(t testing.TB) string { return redis.ServerURLForTest(t) }

// isolated returns the server URL with a key prefix of its own, and removes every key under
// that prefix when the test ends.
func isolated(t testing.TB) (rawURL, prefix string) {
	base := serverURL(t)
	prefix = "fenced-test:" + rand.Text() + ":"
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("key_prefix", prefix)
	u.RawQuery = q.Encode()
	opt, err := goredis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := goredis.NewClient(opt)
		defer c.Close()
		if err := deleteKeys(c, prefix); err != nil {
			t.Errorf("delete test keys under %s: %v", prefix, err)
		}
	})
	return u.String(), prefix
}

func deleteKeys(c *goredis.Client, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	return c.Del(ctx, keys...).Err()
}

func open(t testing.TB, rawURL string) *redis.Driver {
	t.Helper()
	d, err := redis.Open(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// expireScript moves an installed lease's expiry one second into the server's past.
var expireScript = goredis.NewScript(`
local t = redis.call('TIME')
if redis.call('HEXISTS', KEYS[1], 'owner') == 1 then
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('HSET', KEYS[1], 'lease_until_us', string.format('%d', now - 1000000))
end
return 1
`)

// newTarget gives each test its own key prefix; every Open is a new client with its own
// connections.
func newTarget(t *testing.T) drivertest.Target {
	rawURL, prefix := isolated(t)
	admin := open(t, rawURL)
	return drivertest.Target{
		Open: func(t *testing.T) driver.Driver { return open(t, rawURL) },
		// The store is every key under its prefix: deleting them is FLUSHDB for this store,
		// without touching the other tests sharing the server.
		LoseEverything: func(context.Context) error { return deleteKeys(admin.Client().(*goredis.Client), prefix) },
		SetEpoch: func(ctx context.Context, epoch int64) error {
			return admin.Client().Set(ctx, prefix+"epoch", epoch, 0).Err()
		},
		// This machine's Redis, like Redis's defaults, has no append-only file.
		AllowNonDurable: true,
		Expire: func(ctx context.Context, resource string) error {
			return expireScript.Run(ctx, admin.Client(), []string{admin.Key(resource)}).Err()
		},
		LostReply: func(t *testing.T) (driver.Driver, func()) {
			u, err := url.Parse(rawURL)
			if err != nil {
				t.Fatal(err)
			}
			proxy := drivertest.StartProxy(t, u.Host)
			u.Host = proxy.Addr()
			return open(t, u.String()), func() {
				// The scripts must be cached: a NOSCRIPT answer to EVALSHA would be the reply the
				// proxy drops, and the script would never run.
				if err := admin.Migrate(context.Background()); err != nil {
					t.Fatal(err)
				}
				proxy.LoseNextReply()
			}
		},
		Unreachable: func(t *testing.T) driver.Driver {
			return open(t, "redis://"+drivertest.ClosedAddr(t)+"/0?dial_timeout=1s")
		},
		NoRowLock: "Redis has no locks: each operation is one script that runs alone from start to end " +
			"and reads TIME inside it, so nothing can make it wait between reading the clock and writing",
	}
}

func TestConformance(t *testing.T) { drivertest.Run(t, newTarget) }

// migrated opens a driver and runs Migrate, which creates the epoch key every script needs.
func migrated(t testing.TB, rawURL string) *redis.Driver {
	t.Helper()
	d := open(t, rawURL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestProvisionNeverResetsAfterPublication(t *testing.T) {
	t.Parallel()
	rawURL, _ := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, "r", "owner-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := d.PublishAndRelease(ctx, driver.LeaseRef{Resource: "r", Owner: "owner-a", Epoch: g.Epoch, Generation: g.Generation},
		driver.Publication{Payload: []byte("v1"), OpID: "op-1"})
	if err != nil || !ok {
		t.Fatalf("publish and release: %v %v", ok, err)
	}
	before, err := d.Client().HGetAll(ctx, d.Key("r")).Result()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := d.Provision(ctx, "r"); err != nil {
			t.Fatal(err)
		}
	}
	after, err := d.Client().HGetAll(ctx, d.Key("r")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != len(after) {
		t.Fatalf("provision changed the hash: before %v after %v", before, after)
	}
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("provision changed %s: %q -> %q", k, v, after[k])
		}
	}
	if after["generation"] != "1" || after["published_generation"] != "1" || after["payload"] != "v1" {
		t.Fatalf("hash after publication and provision: %v", after)
	}
	if g2, err := d.Acquire(ctx, "r", "owner-b", time.Minute); err != nil || g2.Generation != 2 {
		t.Fatalf("next acquisition: %+v %v, want generation 2", g2, err)
	}
}

// TestLeaseIsNotKeyExpiry: the lease lives in a field compared with TIME; the hash itself never
// gets an expiry, so the generation cannot vanish with a lease.
func TestLeaseIsNotKeyExpiry(t *testing.T) {
	t.Parallel()
	rawURL, _ := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Acquire(ctx, "r", "o", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if ttl, err := d.Client().PTTL(ctx, d.Key("r")).Result(); err != nil || ttl != -1 {
		t.Fatalf("PTTL of the resource key = %v (%v), want -1 (no expiry)", ttl, err)
	}
	st, err := d.Read(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if st.Now.IsZero() || st.LeaseUntil.IsZero() || st.Owner != "o" || st.Generation != 1 {
		t.Fatalf("state %+v", st)
	}
}

// TestAcquireResentGetsItsOwnGrant: an acquisition resent after a lost reply carries the same
// fresh owner and must get its grant back, not a busy refusal naming itself.
func TestAcquireResentGetsItsOwnGrant(t *testing.T) {
	t.Parallel()
	rawURL, _ := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	first, err := d.Acquire(ctx, "r", "owner-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	again, err := d.Acquire(ctx, "r", "owner-a", time.Minute)
	if err != nil || again != first {
		t.Fatalf("resent acquisition: %+v %v, want %+v", again, err, first)
	}
	_, err = d.Acquire(ctx, "r", "owner-b", time.Minute)
	var busy *driver.BusyError
	if !errors.As(err, &busy) || busy.Generation != first.Generation || !busy.LeaseUntil.Equal(first.LeaseUntil) {
		t.Fatalf("other owner: %v, want busy at generation %d", err, first.Generation)
	}
}

// TestForeignValueIsAnError: a key of another type under the resource's name is an operational
// error for every operation, never busy, not found or a refusal.
func TestForeignValueIsAnError(t *testing.T) {
	t.Parallel()
	rawURL, _ := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	if err := d.Client().Set(ctx, d.Key("r"), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := d.Provision(ctx, "r"); err == nil {
		t.Fatal("provision over a string succeeded")
	}
	if _, err := d.Acquire(ctx, "r", "o", time.Minute); err == nil || errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("acquire over a string: %v", err)
	}
	ref := driver.LeaseRef{Resource: "r", Owner: "o", Epoch: 1, Generation: 1}
	if _, ok, err := d.Renew(ctx, ref, time.Minute); err == nil || ok {
		t.Fatalf("renew over a string: %v %v", ok, err)
	}
	if ok, err := d.Publish(ctx, ref, driver.Publication{Payload: []byte("x"), OpID: "op"}); err == nil || ok {
		t.Fatalf("publish over a string: %v %v", ok, err)
	}
	if ok, err := d.Release(ctx, ref); err == nil || ok {
		t.Fatalf("release over a string: %v %v", ok, err)
	}
	// WRONGTYPE is raised by each script's first read, before any write: not applied.
	if _, err := d.Acquire(ctx, "r", "o", time.Minute); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("acquire over a string: %v, want not applied", err)
	}
	if _, err := d.Read(ctx, "r"); err == nil || errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("read over a string: %v", err)
	}
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	rawURL, prefix := isolated(t)
	d, ctx := open(t, rawURL), testCtx(t)
	for range 2 {
		if err := d.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := d.Client().Get(ctx, prefix+"schema").Result(); err != nil || v != "3" {
		t.Fatalf("schema key = %q (%v)", v, err)
	}
	for _, v := range []string{"4", "garbage"} {
		if err := d.Client().Set(ctx, prefix+"schema", v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := d.Migrate(ctx); err == nil {
			t.Fatalf("migrate over schema version %q succeeded", v)
		}
	}
}

func TestOpenAndNew(t *testing.T) {
	t.Parallel()
	rawURL, prefix := isolated(t)
	ctx := testCtx(t)
	a, b := migrated(t, rawURL), open(t, rawURL)
	if a.Key("x") != prefix+"r:{x}" {
		t.Fatalf("key %q does not use the prefix %q", a.Key("x"), prefix)
	}
	idA, errA := a.Client().ClientID(ctx).Result()
	idB, errB := b.Client().ClientID(ctx).Result()
	if errA != nil || errB != nil || idA == idB {
		t.Fatalf("two Opens share a connection: %d %d (%v %v)", idA, idB, errA, errB)
	}
	for _, bad := range []string{"redis://127.0.0.1:6379/0?max_retries=3", "http://127.0.0.1/", "redis://127.0.0.1:6379/0?bogus=1", "::"} {
		if d, err := redis.Open(bad); err == nil {
			_ = d.Close()
			t.Errorf("Open(%q) succeeded", bad)
		}
	}

	opt, err := goredis.ParseURL(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	c := goredis.NewClient(opt)
	defer c.Close()
	if d := redis.New(c, nil); d.Key("x") != redis.DefaultKeyPrefix+"r:{x}" {
		t.Fatalf("default key %q", d.Key("x"))
	}
	d := redis.New(c, &redis.Options{KeyPrefix: prefix})
	if err := d.Provision(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Close closed the caller's client: %v", err)
	}
	// Both drivers see the same row through different clients.
	if st, err := a.Read(ctx, "shared"); err != nil || st.Generation != 0 {
		t.Fatalf("read through another client: %+v %v", st, err)
	}
}

func TestPayloadBytesSurvive(t *testing.T) {
	t.Parallel()
	rawURL, _ := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	g, err := d.Acquire(ctx, "r", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ref := driver.LeaseRef{Resource: "r", Owner: "o", Epoch: g.Epoch, Generation: g.Generation}
	if ok, err := d.Publish(ctx, ref, driver.Publication{Payload: all, OpID: "op"}); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	got, gen, err := d.ReadPayload(ctx, "r")
	if err != nil || gen != g.Generation || !bytes.Equal(got, all) {
		t.Fatalf("read payload: %v at %d (%v)", got, gen, err)
	}
}

// TestCheckDurability compares CheckDurability with the server's own configuration; a server
// that cannot be asked is an error, not a verdict.
func TestCheckDurability(t *testing.T) {
	t.Parallel()
	rawURL, _ := isolated(t)
	d, ctx := open(t, rawURL), testCtx(t)
	cfg, err := d.Client().ConfigGet(ctx, "append*").Result()
	if err != nil {
		t.Skipf("CONFIG GET is not available: %v", err)
	}
	want := 0
	if cfg["appendonly"] != "yes" {
		want++
	}
	if cfg["appendfsync"] != "always" {
		want++
	}
	warnings, err := d.CheckDurability(ctx)
	if err != nil || len(warnings) != want {
		t.Fatalf("CheckDurability = %q, %v with appendonly=%s appendfsync=%s", warnings, err, cfg["appendonly"], cfg["appendfsync"])
	}
	for _, w := range warnings {
		t.Logf("this server is not durable: %s", w)
	}

	down := open(t, "redis://"+drivertest.ClosedAddr(t)+"/0?dial_timeout=1s")
	if warnings, err := down.CheckDurability(ctx); err == nil || len(warnings) != 0 {
		t.Fatalf("CheckDurability of an unreachable server = %q, %v, want an error", warnings, err)
	}
}

// TestEpochBumpIsOneWrite: a bump rewrites no resource hash; the epoch compare in every
// script is what frees and fences the earlier leases.
func TestEpochBumpIsOneWrite(t *testing.T) {
	t.Parallel()
	rawURL, _ := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, "r", "owner-a", time.Hour)
	if err != nil || g.Epoch < 1<<40 {
		t.Fatalf("acquire: %+v, %v; want an epoch from the server's clock", g, err)
	}
	before, err := d.Client().HGetAll(ctx, d.Key("r")).Result()
	if err != nil {
		t.Fatal(err)
	}
	e, err := d.BumpEpoch(ctx)
	if err != nil || e <= g.Epoch {
		t.Fatalf("bump: %d after %d, %v", e, g.Epoch, err)
	}
	after, err := d.Client().HGetAll(ctx, d.Key("r")).Result()
	if err != nil || after["owner"] != "owner-a" || len(after) != len(before) {
		t.Fatalf("the bump changed the hash: before %v after %v (%v)", before, after, err)
	}
	st, err := d.Read(ctx, "r")
	if err != nil || st.Held() || st.Owner != "" || st.Epoch != g.Epoch || st.CurrentEpoch != e {
		t.Fatalf("read after the bump: %+v, %v", st, err)
	}
	old := driver.LeaseRef{Resource: "r", Owner: "owner-a", Epoch: g.Epoch, Generation: g.Generation}
	if _, ok, err := d.Renew(ctx, old, time.Hour); ok || err != nil {
		t.Fatalf("renew of a lease from the old epoch: %v, %v", ok, err)
	}
	// The same owner acquiring again is not a resend of its grant: the old lease is gone.
	g2, err := d.Acquire(ctx, "r", "owner-a", time.Hour)
	if err != nil || g2.Epoch != e || g2.Generation != g.Generation+1 {
		t.Fatalf("acquire after the bump: %+v, %v", g2, err)
	}
}

// TestMissingEpochKeyIsAnError: no script guesses an epoch, and BumpEpoch does not restart at 1.
func TestMissingEpochKeyIsAnError(t *testing.T) {
	t.Parallel()
	rawURL, prefix := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if err := d.Client().Del(ctx, prefix+"epoch").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Acquire(ctx, "r", "o", time.Minute); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("acquire without an epoch key: %v, want a not-applied error", err)
	}
	if _, err := d.BumpEpoch(ctx); !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("bump without an epoch key: %v", err)
	}
	if n, err := d.Client().Exists(ctx, prefix+"epoch").Result(); err != nil || n != 0 {
		t.Fatalf("the epoch key was recreated: %d, %v", n, err)
	}
}

// TestMigrateFromVersion1: rows written before epochs existed keep their generations, and a
// lease they hold is free after the upgrade (it belongs to no epoch).
func TestMigrateFromVersion1(t *testing.T) {
	t.Parallel()
	rawURL, prefix := isolated(t)
	d, ctx := open(t, rawURL), testCtx(t)
	c := d.Client()
	if err := c.Set(ctx, prefix+"schema", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, d.Key("r"), "generation", "7", "published_generation", "6", "owner", "old",
		"lease_until_us", "99999999999999999").Err(); err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := d.Read(ctx, "r")
	if err != nil || st.Held() || st.Generation != 7 || st.CurrentEpoch < 1<<40 {
		t.Fatalf("read after the upgrade: %+v, %v", st, err)
	}
	if g, err := d.Acquire(ctx, "r", "new", time.Minute); err != nil || g.Epoch != st.CurrentEpoch || g.Generation != 8 {
		t.Fatalf("acquire after the upgrade: %+v, %v", g, err)
	}
}

// TestScriptErrorWritesNothing: a publication that fails inside its script (a corrupt field
// found by its checks) leaves the payload and the operation record untouched and is reported
// as not applied.
func TestScriptErrorWritesNothing(t *testing.T) {
	t.Parallel()
	rawURL, _ := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	if err := d.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := d.Acquire(ctx, "r", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Client().HSet(ctx, d.Key("r"), "published_generation", "garbage").Err(); err != nil {
		t.Fatal(err)
	}
	ref := driver.LeaseRef{Resource: "r", Owner: "o", Epoch: g.Epoch, Generation: g.Generation}
	ok, err := d.PublishAndRelease(ctx, ref, driver.Publication{Payload: []byte("x"), OpID: "op"})
	if ok || !errors.Is(err, driver.ErrNotApplied) {
		t.Fatalf("publish over a corrupt row: %v, %v, want a not-applied error", ok, err)
	}
	h, err := d.Client().HGetAll(ctx, d.Key("r")).Result()
	if err != nil || h["payload"] != "" || h["owner"] != "o" {
		t.Fatalf("the failed script wrote: %v (%v)", h, err)
	}
	if op, err := d.ReadOperation(ctx, "op"); err != nil || op.Outcome != "" {
		t.Fatalf("the failed script recorded the operation: %+v, %v", op, err)
	}
}

// TestPruneMatchesThePrefixLiterally: a key prefix with glob characters prunes only its own
// records.
func TestPruneMatchesThePrefixLiterally(t *testing.T) {
	t.Parallel()
	rawURL, prefix := isolated(t)
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	withPrefix := func(p string) *redis.Driver {
		q := u.Query()
		q.Set("key_prefix", p)
		v := *u
		v.RawQuery = q.Encode()
		return migrated(t, v.String())
	}
	ctx := testCtx(t)
	glob, other := withPrefix(prefix+"[x]*:"), withPrefix(prefix+"x-other:")
	for _, d := range []*redis.Driver{glob, other} {
		if _, err := d.ResolveOperation(ctx, "op"); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for { // until the server's clock has moved past the record
		n, err := glob.PruneOperations(ctx, time.Microsecond)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if n != 0 || time.Now().After(deadline) {
			t.Fatalf("pruned %d", n)
		}
	}
	if op, err := other.ReadOperation(ctx, "op"); err != nil || op.Outcome != driver.OutcomeAborted {
		t.Fatalf("another prefix's record after pruning: %+v, %v", op, err)
	}
}
