package artifact

import (
	"context"
	"crypto/rand"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/driver/drivertest"
	goredis "github.com/redis/go-redis/v9"
)

// MariaDB (or MySQL) and Redis as the pointers' home. etcd is not in the matrix yet: its tests
// start an in-process cluster that lives in the etcd backend's test files.

func mariadbHome(t testing.TB) home {
	server := drivertest.ServerURL(t, "FENCED_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test", func(u string) error {
		d, err := mysql.Open(u)
		if err != nil {
			return err
		}
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return d.DB().PingContext(ctx)
	})
	admin, err := mysql.Open(server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	name := "fenced_artifact_" + strings.ToLower(rand.Text()[:16])
	if _, err := admin.DB().ExecContext(testCtx(t), "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.DB().ExecContext(ctx, "DROP DATABASE `"+name+"`"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	open := func(t testing.TB) *mysql.Driver {
		d, err := mysql.Open(u.String())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	return home{
		name: "mariadb",
		open: func(t testing.TB) (*fenced.Store, *fenced.Store, func()) {
			lossy, arm := drivertest.LoseReplies(open(t))
			return newStore(t, open(t)), newStore(t, lossy), arm
		},
		expire: func(ctx context.Context, resource string) error {
			_, err := admin.DB().ExecContext(ctx, "UPDATE `"+name+"`.fenced_resources SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE resource = ? AND lease_until IS NOT NULL", resource)
			return err
		},
		copyRow: func(ctx context.Context, resource string) (func(ctx context.Context) error, error) {
			return sqlRowCopy(dbExec(admin.DB()), "`"+name+"`.fenced_resources", resource)(ctx)
		},
	}
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

func redisHome(t testing.TB) home {
	base := drivertest.ServerURL(t, "FENCED_TEST_REDIS", "redis://127.0.0.1:6379/0", func(u string) error {
		opt, err := goredis.ParseURL(u)
		if err != nil {
			return err
		}
		c := goredis.NewClient(opt)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	})
	prefix := "fenced-artifact-test:" + rand.Text() + ":"
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("key_prefix", prefix)
	u.RawQuery = q.Encode()
	open := func(t testing.TB) *redis.Driver {
		d, err := redis.Open(u.String())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	admin := open(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := admin.Client()
		iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("delete test keys: %v", err)
			}
		}
		_ = admin.Close()
	})
	return home{
		name: "redis",
		open: func(t testing.TB) (*fenced.Store, *fenced.Store, func()) {
			// The shared test server runs without persistence; durability is not under test here.
			cfg := &fenced.Config{AllowNonDurable: true}
			lossy, arm := drivertest.LoseReplies(open(t))
			return newStoreWith(t, open(t), cfg), newStoreWith(t, lossy, cfg), arm
		},
		expire: func(ctx context.Context, resource string) error {
			return expireScript.Run(ctx, admin.Client(), []string{admin.Key(resource)}).Err()
		},
	}
}
