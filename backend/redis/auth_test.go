package redis_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/redis"
)

// startRedis runs a redis-server of the test's own on a free loopback port, with requirepass
// and the durable settings, stopped when the test ends. It skips when no redis-server is
// installed (fails under CI=true).
func startRedis(t *testing.T, password string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed")
		}
		t.Skip("SKIP: redis-server is not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", dir,
		"--requirepass", password, "--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--maxmemory-policy", "noeviction", "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := goredis.NewClient(&goredis.Options{Addr: addr, Password: password, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for { // wait until it answers: polling a condition, not sleeping for a collision
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPasswordAndTLS: a server with requirepass is used through redis://:password@ and
// redis://default:password@; no password, a wrong one, and rediss:// against a server that
// does not speak TLS are clear errors (rediss:// never falls back to plain text), and no error
// repeats the password.
func TestPasswordAndTLS(t *testing.T) {
	t.Parallel()
	password := "Pw-" + strings.Repeat("s3cret", 3)
	addr := startRedis(t, password)
	for _, u := range []string{
		"redis://:" + url.QueryEscape(password) + "@" + addr + "/0",
		"redis://default:" + url.QueryEscape(password) + "@" + addr + "/0",
	} {
		d, err := redis.Open(u + "?key_prefix=" + url.QueryEscape("t:"+fmt.Sprint(time.Now().UnixNano())+":"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := fenced.New(testCtx(t), d, nil) // durable settings: no warning, no refusal
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Provision(testCtx(t), "auth ü/x"); err != nil {
			t.Fatal(err)
		}
		l, err := s.Acquire(testCtx(t), "auth ü/x", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.PublishAndRelease(testCtx(t), []byte("a\x00b")); err != nil {
			t.Fatal(err)
		}
		_ = d.Close()
	}
	for _, c := range []struct{ url, want string }{
		{"redis://" + addr + "/0", "NOAUTH"},
		{"redis://:wrong" + password + "@" + addr + "/0", "WRONGPASS"},
		{"redis://:" + password + "@" + addr + ":notaport/0", "invalid port"},
	} {
		err := func() error {
			d, err := redis.Open(c.url)
			if err != nil {
				return err
			}
			defer d.Close()
			_, err = fenced.New(testCtx(t), d, nil)
			return err
		}()
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), password) {
			t.Errorf("%s: %v, want an error saying %q without the password", strings.ReplaceAll(c.url, password, "xxxxx"), err, c.want)
		}
	}
	// rediss:// against a server without TLS: go-redis's handshake waits for an answer the
	// server never sends, so the error is a timeout; what matters is that nothing is sent in
	// plain text and nothing succeeds.
	d, err := redis.Open("rediss://:" + password + "@" + addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := d.Client().Ping(ctx).Err(); err == nil || strings.Contains(err.Error(), password) {
		t.Fatalf("rediss:// to a plain-text server: %v, want an error without the password", err)
	}
}
