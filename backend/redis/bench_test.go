package redis

import (
	"context"
	"crypto/rand"
	"net/url"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// BenchmarkProtocol compares fenced on Redis with the same Lua scripts run directly through
// go-redis (on Redis the script is the raw statement), both on clients with 16 connections.
// Run with: go test -run '^$' -bench Protocol -count 6 ./backend/redis/ and compare with
// benchstat -col /impl.
func BenchmarkProtocol(b *testing.B) {
	base := ServerURLForTest(b)
	prefix := "fenced-bench:" + rand.Text() + ":"
	u, err := url.Parse(base)
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("key_prefix", prefix)
	q.Set("pool_size", "16")
	u.RawQuery = q.Encode()
	open := func(b *testing.B) *Driver {
		d, err := Open(u.String())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = d.Close() })
		return d
	}
	admin := open(b)
	b.Cleanup(func() {
		ctx := context.Background()
		iter := admin.client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if err := admin.client.Unlink(ctx, iter.Val()).Err(); err != nil {
				b.Error(err)
				return
			}
		}
		if err := iter.Err(); err != nil {
			b.Error(err)
		}
	})
	drivertest.Bench(b, drivertest.BenchTarget{
		Open: func(b *testing.B) driver.Driver { return open(b) },
		Raw:  func(b *testing.B) drivertest.Raw { d := open(b); return raw{d} },
		// This machine's Redis, like Redis's defaults, has no append-only file.
		AllowNonDurable: true,
	})
}

// raw is the baseline: each script run directly with go-redis, as hand-written code would,
// with the same keys (the publication scripts record the operation id too).
type raw struct{ d *Driver }

func (r raw) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, bool, error) {
	v, err := scriptAcquire.Run(ctx, r.d.client, r.d.leaseKeys(resource), owner, ttl.Microseconds()).Int64Slice()
	if err != nil {
		return driver.Grant{}, false, err
	}
	return driver.Grant{Epoch: v[1], Generation: v[2]}, v[0] == 1, nil
}

func (r raw) one(ctx context.Context, s *goredis.Script, keys []string, args ...any) (bool, error) {
	n, err := s.Run(ctx, r.d.client, keys, args...).Int64()
	return n == 1, err
}

func (r raw) publish(ctx context.Context, s *goredis.Script, l driver.LeaseRef, p driver.Publication) (bool, error) {
	keys := []string{r.d.Key(l.Resource), r.d.epochKey(), r.d.incarnationKey(), r.d.OperationKey(p.OpID)}
	return r.one(ctx, s, keys, l.Owner, l.Generation, l.Epoch, p.Payload, p.SourceVersion, l.Resource,
		r.d.releasedChannel())
}

func (r raw) Publish(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.publish(ctx, scriptPublish, l, p)
}

func (r raw) PublishAndRelease(ctx context.Context, l driver.LeaseRef, p driver.Publication) (bool, error) {
	return r.publish(ctx, scriptPublishAndRelease, l, p)
}

func (r raw) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	return r.one(ctx, scriptRelease, r.d.leaseKeys(l.Resource), l.Owner, l.Generation, l.Epoch,
		r.d.releasedChannel())
}

// ServerURLForTest is the Redis server the tests and benchmarks use: FENCED_TEST_REDIS, else
// the local default. It is exported to the external test package.
func ServerURLForTest(t testing.TB) string {
	return drivertest.ServerURL(t, "FENCED_TEST_REDIS", "redis://127.0.0.1:6379/0", func(u string) error {
		opt, err := goredis.ParseURL(u)
		if err != nil {
			return err
		}
		c := goredis.NewClient(opt)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	})
}
