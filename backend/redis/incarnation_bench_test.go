package redis

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// BenchmarkIncarnationCheck measures what the two INFO calls of every lease-carrying script
// cost: acquire+release pairs through the raw scripts as shipped (check=info-twice), with one
// INFO call asking for both sections (check=info-once, Redis 7 and later), and with no INFO
// at all, the recorded incarnation read back as the server's (check=none, the baseline: what
// the scripts cost without the restart detection). Same client, same run:
//
//	go test -run '^$' -bench IncarnationCheck -benchtime 1s -count 5 ./backend/redis/
func BenchmarkIncarnationCheck(b *testing.B) {
	once := strings.Replace(serverIncarnation, `  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')`,
		`  local info = redis.call('INFO', 'server', 'replication')
  local run = string.match(info, 'run_id:(%x+)')
  local replid = string.match(info, 'master_replid:(%x+)')`, 1)
	none := `
local function serverIncarnation()
  return redis.call('GET', KEYS[3])
end
`
	if once == serverIncarnation {
		b.Fatal("serverIncarnation changed; update the benchmark")
	}
	variants := []struct{ name, fn string }{{"info-twice", serverIncarnation}, {"info-once", once}, {"none", none}}
	base := ServerURLForTest(b)
	prefix := "fenced-bench:" + rand.Text() + ":"
	d, err := Open(base + "?key_prefix=" + prefix + "&pool_size=16")
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if err := d.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() {
		iter := d.client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = d.client.Unlink(ctx, iter.Val()).Err()
		}
	}()
	var next atomic.Int64
	for _, workers := range []int{1, 16} {
		for _, v := range variants {
			acquire := goredis.NewScript(strings.Replace(luaAcquire, serverIncarnation, v.fn, 1))
			release := goredis.NewScript(strings.Replace(luaRelease, serverIncarnation, v.fn, 1))
			if v.fn != serverIncarnation && (acquire.Hash() == scriptAcquire.Hash() || release.Hash() == scriptRelease.Hash()) {
				b.Fatal("the variant did not replace the incarnation check")
			}
			b.Run(fmt.Sprintf("g%d/check=%s", workers, v.name), func(b *testing.B) {
				pair := func(resource string) error {
					v, err := acquire.Run(ctx, d.client, d.leaseKeys(resource), "owner", time.Minute.Microseconds()).Int64Slice()
					if err != nil {
						return err
					}
					if v[0] != 1 {
						return fmt.Errorf("not acquired: %v", v)
					}
					return release.Run(ctx, d.client, d.leaseKeys(resource), "owner", v[2], v[1], d.releasedChannel()).Err()
				}
				resource := func() string {
					r := fmt.Sprintf("bench résource %d", next.Add(1))
					if err := d.Provision(ctx, r); err != nil {
						b.Fatal(err)
					}
					return r
				}
				if workers == 1 {
					r := resource()
					b.ResetTimer()
					for range b.N {
						if err := pair(r); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.SetParallelism(8)
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						r := resource()
						for pb.Next() {
							if err := pair(r); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
			})
		}
	}
}
