package redis_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/driver"
)

// TestIncarnationChangeBumpsEpoch: when the recorded incarnation is not the server's (as after a
// restart or a promotion), the first lease-carrying script bumps the epoch to at least TIME and
// then works under it: the old lease is refused, the next token is greater. While it matches,
// nothing is bumped. A store without a recorded incarnation (written by a version-2 driver)
// is bumped the same way.
func TestIncarnationChangeBumpsEpoch(t *testing.T) {
	t.Parallel()
	rawURL, prefix := isolated(t)
	d, ctx := migrated(t, rawURL), testCtx(t)
	for _, r := range []string{"r ü", "s"} {
		if err := d.Provision(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	a, err := d.Acquire(ctx, "r ü", "a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := d.Acquire(ctx, "s", "b", time.Hour); err != nil || b.Epoch != a.Epoch {
		t.Fatalf("a second acquisition under the same incarnation: %+v, %v; want epoch %d", b, err, a.Epoch)
	}
	for name, change := range map[string]func() error{
		"another incarnation recorded": func() error { return d.Client().Set(ctx, prefix+"incarnation", "0:0", 0).Err() },
		"none recorded":                func() error { return d.Client().Del(ctx, prefix+"incarnation").Err() },
	} {
		if err := change(); err != nil {
			t.Fatal(err)
		}
		clock, err := d.Client().Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ref := driver.LeaseRef{Resource: "r ü", Owner: "a", Epoch: a.Epoch, Generation: a.Generation}
		if ok, err := d.Publish(ctx, ref, driver.Publication{Payload: []byte("stale\x00"), OpID: "op-" + strconv.FormatInt(a.Epoch, 10)}); ok || err != nil {
			t.Fatalf("%s: a lease from before the change published: %v, %v", name, ok, err)
		}
		st, err := d.Read(ctx, "r ü")
		if err != nil || st.CurrentEpoch <= a.Epoch || st.CurrentEpoch < clock.UnixMicro() || st.Held() {
			t.Fatalf("%s: after the refused publication: %+v, %v; want the epoch bumped past %d and the clock %d",
				name, st, err, a.Epoch, clock.UnixMicro())
		}
		g, err := d.Acquire(ctx, "r ü", "c", time.Hour)
		if err != nil || g.Epoch != st.CurrentEpoch || g.Generation != a.Generation+1 {
			t.Fatalf("%s: acquire after the change: %+v, %v", name, g, err)
		}
		a = g
	}
}

// server is a redis-server of the test's own, in a directory of its own, so that it can be
// restarted, promoted and demoted without touching the shared server.
type server struct {
	t    *testing.T
	dir  string
	port int
	cmd  *exec.Cmd
}

func startServer(t *testing.T, dir string, port int, args ...string) *server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not installed: %v", err)
		}
		t.Skipf("!!! redis-server is not installed, so restarts are not tested: %v", err)
	}
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	s := &server{t: t, dir: dir, port: port}
	s.cmd = exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--repl-diskless-sync-delay", "0", "--logfile", filepath.Join(dir, "log")}, args...)...)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	c := s.client()
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on port %d did not answer", port)
		}
		time.Sleep(20 * time.Millisecond) // polling its readiness, not ordering anything
	}
	return s
}

func (s *server) client() *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: s.addr(), MaxRetries: -1})
}

func (s *server) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

func (s *server) url() string { return "redis://" + s.addr() + "/0" }

// stop ends the process without saving and waits for it to exit.
func (s *server) stop() {
	if s.cmd.ProcessState != nil {
		return
	}
	c := s.client()
	_ = c.ShutdownNoSave(context.Background()).Err()
	_ = c.Close()
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

func mustDo(t *testing.T, c *goredis.Client, args ...any) {
	t.Helper()
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// acquireRelease acquires r and releases it, returning the token.
func acquireRelease(t *testing.T, d *redis.Driver, owner string) driver.Grant {
	t.Helper()
	g, err := d.Acquire(testCtx(t), "r ü", owner, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Release(testCtx(t), driver.LeaseRef{Resource: "r ü", Owner: owner, Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
		t.Fatalf("release: %v, %v", ok, err)
	}
	return g
}

func greater(a, b driver.Grant) bool {
	return a.Epoch > b.Epoch || a.Epoch == b.Epoch && a.Generation > b.Generation
}

// TestRestartFromOldSnapshot: the dangerous restart. The server saves a snapshot, acknowledges
// more acquisitions, and restarts from the snapshot: the keys are there, the later history is
// not. A driver that was open across the restart (no Migrate) gets a token greater than every
// one issued before, and a lease from the lost history is refused.
func TestRestartFromOldSnapshot(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := startServer(t, dir, 0)
	d := migrated(t, srv.url())
	ctx := testCtx(t)
	if err := d.Provision(ctx, "r ü"); err != nil {
		t.Fatal(err)
	}
	acquireRelease(t, d, "a")
	c := srv.client()
	mustDo(t, c, "SAVE")
	_ = c.Close()
	acquireRelease(t, d, "b")
	lost, err := d.Acquire(ctx, "r ü", "c", time.Hour) // acknowledged, then lost in the restart
	if err != nil {
		t.Fatal(err)
	}

	srv.stop()
	startServer(t, dir, srv.port) // from the snapshot, on the port the driver knows
	if st, err := d.Read(ctx, "r ü"); err != nil || st.Generation >= lost.Generation {
		t.Fatalf("after the restart the snapshot's row is %+v (%v); the test needs one older than generation %d", st, err, lost.Generation)
	}
	g, err := d.Acquire(ctx, "r ü", "d", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !greater(g, lost) {
		t.Fatalf("after a restart from an older snapshot the server issued %+v, not greater than %+v issued before it", g, lost)
	}
	ref := driver.LeaseRef{Resource: "r ü", Owner: "c", Epoch: lost.Epoch, Generation: lost.Generation}
	if ok, err := d.Release(ctx, ref); ok || err != nil {
		t.Fatalf("a lease from the lost history released: %v, %v", ok, err)
	}
}

// TestPromotionAfterResync: the same process is primary, is demoted and re-synced from a
// promoted replica that lacked its last acquisition, and is promoted again. Its run_id is the
// one recorded; only its new master_replid shows the lost history, and the next token must
// still be greater.
func TestPromotionAfterResync(t *testing.T) {
	t.Parallel()
	a := startServer(t, t.TempDir(), 0)
	b := startServer(t, t.TempDir(), 0)
	ca, cb := a.client(), b.client()
	defer ca.Close()
	defer cb.Close()
	ctx := testCtx(t)
	d := migrated(t, a.url())
	if err := d.Provision(ctx, "r ü"); err != nil {
		t.Fatal(err)
	}
	acquireRelease(t, d, "x")

	mustDo(t, cb, "REPLICAOF", "127.0.0.1", strconv.Itoa(a.port))
	waitReplicated(t, ca)
	mustDo(t, cb, "REPLICAOF", "NO", "ONE") // b is promoted with what it has
	lost := acquireRelease(t, d, "y")       // acknowledged by a only

	mustDo(t, ca, "REPLICAOF", "127.0.0.1", strconv.Itoa(b.port)) // a is demoted and re-synced from b
	waitSynced(t, ca)
	mustDo(t, ca, "REPLICAOF", "NO", "ONE") // and promoted again
	if st, err := d.Read(ctx, "r ü"); err != nil || st.Generation >= lost.Generation {
		t.Fatalf("after the resync a's row is %+v (%v); the test needs it to lack generation %d", st, err, lost.Generation)
	}
	g, err := d.Acquire(ctx, "r ü", "z", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !greater(g, lost) {
		t.Fatalf("after a promotion the server issued %+v, not greater than %+v issued before it", g, lost)
	}
}

// waitReplicated returns once every write the primary c acknowledged has reached a replica.
func waitReplicated(t *testing.T, c *goredis.Client) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := c.Do(context.Background(), "WAIT", 1, 1000).Int64()
		if err == nil && n >= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replica acknowledged: %d, %v", n, err)
		}
	}
}

// waitSynced returns once the replica c has finished its synchronisation with its primary.
func waitSynced(t *testing.T, c *goredis.Client) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && containsLine(info, "master_link_status:up") && containsLine(info, "master_sync_in_progress:0") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not finish its sync: %q, %v", info, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the server's own state
	}
}

func containsLine(info, line string) bool {
	return slices.Contains(strings.Split(strings.ReplaceAll(info, "\r", ""), "\n"), line)
}

// TestAcquireAfterRestartWritesNothingWhenRefused: after a restart an acquisition must record
// the epoch bump and then take a generation. When it cannot do both it must do neither: a user
// whose ACL allows every command but SET (so it cannot record the bump), and a resource whose
// generation is not an integer (so it cannot take one), each get an error reported as not
// applied, and the resource, the epoch and the recorded incarnation are as they were.
//
// A user that may only read the epoch and incarnation keys (%R~) is not a case: Redis 7 wants
// read and write access to every key a script declares and refuses the script before it runs.
func TestAcquireAfterRestartWritesNothingWhenRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := startServer(t, dir, 0)
	owner := migrated(t, srv.url())
	ctx := testCtx(t)
	if err := owner.Provision(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	g, err := owner.Acquire(ctx, "r", "a", time.Hour) // records the incarnation
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := owner.Release(ctx, driver.LeaseRef{Resource: "r", Owner: "a", Epoch: g.Epoch, Generation: g.Generation}); !ok || err != nil {
		t.Fatalf("release: %v, %v", ok, err)
	}
	c := srv.client()
	mustDo(t, c, "SAVE")
	_ = c.Close()
	srv.stop()
	srv = startServer(t, dir, srv.port) // a new run_id: the next acquisition bumps
	c = srv.client()
	defer c.Close()
	prefix := strings.TrimSuffix(owner.Key("r"), "r:{r}")
	keys := []string{prefix + "epoch", prefix + "incarnation"}
	wantUnchanged := func(what string, acquire func() error) {
		t.Helper()
		before, err := c.HGetAll(ctx, owner.Key("r")).Result()
		if err != nil {
			t.Fatal(err)
		}
		meta, err := c.MGet(ctx, keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := acquire(); err == nil || !errors.Is(err, driver.ErrNotApplied) {
			t.Fatalf("%s: %v, want an error reported as not applied", what, err)
		}
		if after, err := c.HGetAll(ctx, owner.Key("r")).Result(); err != nil || !maps.Equal(before, after) {
			t.Errorf("%s wrote the resource: %v (%v), was %v", what, after, err, before)
		}
		if m, err := c.MGet(ctx, keys...).Result(); err != nil || !slices.Equal(m, meta) {
			t.Errorf("%s wrote the epoch or the incarnation: %v (%v), was %v", what, m, err, meta)
		}
	}

	mustDo(t, c, "ACL", "SETUSER", "worker", "on", ">worker-pw", "~*", "&*", "+@all", "-set")
	worker := open(t, "redis://worker:worker-pw@"+srv.addr()+"/0")
	wantUnchanged("acquire by a user that may not SET", func() error {
		_, err := worker.Acquire(ctx, "r", "w", time.Hour)
		return err
	})

	if err := c.HSet(ctx, owner.Key("r"), "generation", "garbage").Err(); err != nil {
		t.Fatal(err)
	}
	wantUnchanged("acquire of a resource whose generation is not an integer", func() error {
		_, err := owner.Acquire(ctx, "r", "o", time.Hour)
		return err
	})
}
