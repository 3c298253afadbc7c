package cli_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// TestRedisFlushNeverReissues is the example of issue 18, run as a user would on this
// machine's Redis (no append-only file, like Redis's defaults), on a key prefix of its own:
// the command refuses the non-durable server unless told otherwise, warns once, and after the
// store is flushed and provisioned again the next token is still greater than the first.
func TestRedisFlushNeverReissues(t *testing.T) {
	t.Parallel()
	base := drivertest.ServerURL(t, "FENCED_TEST_REDIS", "redis://127.0.0.1:6379/0", func(u string) error {
		d, err := redis.Open(u)
		if err != nil {
			return err
		}
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return d.Client().Ping(ctx).Err()
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	prefix := "fenced-cli-test:" + rand.Text() + ":"
	q := u.Query()
	q.Set("key_prefix", prefix)
	u.RawQuery = q.Encode()
	admin, err := redis.Open(u.String())
	if err != nil {
		t.Fatal(err)
	}
	flush := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := admin.Client().Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			if err := admin.Client().Del(ctx, iter.Val()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { flush(); _ = admin.Close() })
	warnings, err := admin.CheckDurability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tg := target{t: t, url: u.String(), dir: t.TempDir()}
	if len(warnings) > 0 {
		msg := tg.fails(1, nil, "provision", "q")
		if !strings.Contains(msg, "not configured for durability") || !strings.Contains(msg, "--allow-nondurable") {
			t.Fatalf("refusal of a non-durable server says %q", msg)
		}
	}
	// run runs one command that must succeed; a non-durable server's warning is one line.
	run := func(args ...string) []byte {
		t.Helper()
		r := tg.run(nil, append([]string{"--allow-nondurable"}, args...)...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if r.code != 0 || len(warnings) == 0 && r.stderr != "" || len(warnings) > 0 && len(lines) != 1 {
			t.Fatalf("fenced %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
		}
		return r.stdout
	}
	acquire := func() leaseOut {
		t.Helper()
		var l leaseOut
		if err := json.Unmarshal(run("acquire", "q", "--ttl", "30s"), &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	run("provision", "q")
	first := acquire()
	flush() // what a restart without persistence does
	run("provision", "q")
	second := acquire()
	if second.Epoch < first.Epoch || second.Epoch == first.Epoch && second.Generation <= first.Generation {
		t.Fatalf("after a flush the command issued %d.%d, not greater than %d.%d issued before", second.Epoch,
			second.Generation, first.Epoch, first.Generation)
	}
	run(leaseArgs("publish", "q", second)...)
}
