package cli_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// forEveryBackend runs body through the CLI against every backend a server for which answers
// here: SQLite, PostgreSQL (as the schema's owner and as a role restricted with "fenced
// grant"), MariaDB/MySQL, Redis and etcd (the single member .ci/run starts).
func forEveryBackend(t *testing.T, body func(tg target)) {
	forEachTarget(t, body)
	t.Run("postgres-granted-role", func(t *testing.T) {
		t.Parallel()
		body(grantedPostgres(t))
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		body(target{t: t, url: mysqlDatabase(t), dir: t.TempDir()})
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		body(target{t: t, url: redisPrefix(t), dir: t.TempDir(), lossy: true})
	})
	t.Run("etcd", func(t *testing.T) {
		t.Parallel()
		body(target{t: t, url: etcdPrefix(t), dir: t.TempDir()})
	})
}

// etcdPrefix returns an etcd URL whose keys live under a prefix of this test's own, deleted in
// Cleanup. The server comes from FENCED_TEST_ETCD (.ci/run starts one member on loopback).
func etcdPrefix(t *testing.T) string {
	ping := func(u string) error {
		d, err := etcd.Open(u)
		if err != nil {
			return err
		}
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = d.Client().Get(ctx, "fenced-cli-test-ping")
		return err
	}
	server := drivertest.ServerURL(t, "FENCED_TEST_ETCD", "etcd://127.0.0.1:2379", ping)
	prefix := "fenced-cli-test/" + rand.Text() + "/"
	t.Cleanup(func() {
		d, err := etcd.Open(server)
		if err != nil {
			t.Error(err)
			return
		}
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := d.Client().Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
			t.Errorf("delete test keys: %v", err)
		}
	})
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("prefix", prefix)
	u.RawQuery = q.Encode()
	return u.String()
}

// grantedPostgres is a fresh schema, migrated by its owner, and a new login role granted with
// "fenced grant"; every command of the returned target connects as that role.
func grantedPostgres(t *testing.T) target {
	owner := target{t: t, url: postgresSchema(t), dir: t.TempDir()}
	owner.ok(nil, "migrate")
	role := "fenced_cli_role_" + strings.ToLower(rand.Text()[:12])
	pgExec(t, owner.url, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		pgExec(t, owner.url, "DROP OWNED BY "+role)
		pgExec(t, owner.url, "DROP ROLE "+role)
	})
	owner.ok(nil, "grant", "--role", role, "--as", "admin")
	u, err := url.Parse(owner.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return target{t: t, url: u.String(), dir: owner.dir}
}

func pgExec(t *testing.T, rawURL, stmt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, stmt); err != nil {
		t.Errorf("%s: %v", stmt, err)
	}
}

// mysqlDatabase creates a database of its own on FENCED_TEST_MYSQL (default a local MariaDB),
// dropped at the end, and returns its URL.
func mysqlDatabase(t *testing.T) string {
	exec := func(server, stmt string) error {
		d, err := mysql.Open(server)
		if err != nil {
			return err
		}
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = d.DB().ExecContext(ctx, stmt)
		return err
	}
	server := drivertest.ServerURL(t, "FENCED_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test",
		func(u string) error { return exec(u, "SELECT 1") })
	name := "fenced_cli_" + strings.ToLower(rand.Text()[:16])
	if err := exec(server, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := exec(server, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// redisPrefix returns FENCED_TEST_REDIS (default a local server) with a key prefix of its own,
// whose keys are deleted at the end.
func redisPrefix(t *testing.T) string {
	ping := func(u string) error {
		d, err := redis.Open(u)
		if err != nil {
			return err
		}
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return d.Client().Ping(ctx).Err()
	}
	server := drivertest.ServerURL(t, "FENCED_TEST_REDIS", "redis://127.0.0.1:6379/0", ping)
	prefix := "fenced-cli-test:" + rand.Text() + ":"
	t.Cleanup(func() {
		d, err := redis.Open(server)
		if err != nil {
			t.Error(err)
			return
		}
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := d.Client().Scan(ctx, 0, prefix+"*", 500).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("list test keys: %v", err)
		}
		if len(keys) > 0 {
			if err := d.Client().Del(ctx, keys...).Err(); err != nil {
				t.Errorf("delete test keys: %v", err)
			}
		}
	})
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("key_prefix", prefix)
	u.RawQuery = q.Encode()
	return u.String()
}

func tokenArgs(op, resource string, l leaseOut, extra ...string) []string {
	return append([]string{op, resource, "--owner", l.Owner, "--token", l.Token}, extra...)
}

// wantRefused runs a command that must be refused (exit 5) with a message containing want.
func (tg target) wantRefused(want string, stdin []byte, args ...string) {
	tg.t.Helper()
	if msg := tg.fails(5, stdin, args...); !strings.Contains(msg, want) {
		tg.t.Errorf("fenced %s: %q, want it to say %q", strings.Join(args, " "), msg, want)
	}
}

// TestAfterEpochBump is issue 8's sequence on every backend: after "fenced epoch bump" the
// current holder's owner and generation, as acquire printed them, must keep working without
// --epoch, the token works as one value, and every refusal names the whole token and a true
// cause. Before the fix, --epoch defaulted to 1 and the first publish below was refused with
// "generation 1 was superseded by generation 1".
func TestAfterEpochBump(t *testing.T) {
	t.Parallel()
	forEveryBackend(t, func(tg target) {
		t := tg.t
		const res, old = "nightly report é", "hourly report é"
		payload := []byte("a\x00b\x00\xffc") // NUL bytes and a byte that is not UTF-8
		tg.ok(nil, "provision", res, old)

		// A lease from before the bump, on another resource (generation 2, so epoch 2 != it).
		tg.ok(nil, leaseArgs("release", old, tg.acquire(old, "1m"))...)
		stale := tg.acquire(old, "1m")
		e1 := stale.Epoch // the store's first epoch: the database's clock in microseconds
		if stale.Token != tok(e1, 2) || e1 < 1<<40 || stale.Generation != 2 {
			t.Fatalf("before the bump: %+v", stale)
		}

		e2 := decode[struct {
			Epoch int64 `json:"epoch"`
		}](t, tg.ok(nil, "epoch", "bump")).Epoch
		if e2 <= e1 {
			t.Fatalf("epoch bump printed %d after %d", e2, e1)
		}

		// The sequence: acquire after the bump, then owner + generation only.
		l := tg.acquire(res, "30s")
		if l.Token != tok(e2, 1) || l.Epoch != e2 || l.Generation != 1 || l.Resource != res {
			t.Fatalf("acquire after the bump printed %+v", l)
		}
		out := string(tg.ok(payload, leaseArgs("publish", res, l)...))
		if !strings.Contains(out, `"token":"`+tok(e2, 1)+`"`) || !strings.Contains(out, fmt.Sprintf(`"published_epoch":%d`, e2)) {
			t.Errorf("publish printed %s", out)
		}
		if got := tg.ok(nil, "get", res); !bytes.Equal(got, payload) {
			t.Errorf("get = %q, want %q", got, payload)
		}
		renewed := decode[leaseOut](t, tg.ok(nil, leaseArgs("renew", res, l, "--ttl", "30s")...))
		if renewed.Token != tok(e2, 1) || renewed.Owner != l.Owner {
			t.Errorf("renew printed %+v", renewed)
		}
		// The token as one value.
		renewed = decode[leaseOut](t, tg.ok(nil, tokenArgs("renew", res, l, "--ttl", "30s")...))
		if renewed.Token != tok(e2, 1) {
			t.Errorf("renew --token printed %+v", renewed)
		}
		tg.ok(nil, leaseArgs("renew", res, l, "--epoch", strconv.FormatInt(e2, 10), "--ttl", "30s")...)

		// Refusals of the current holder name the whole token and the true cause.
		tg.wantRefused(`publish "nightly report é" refused: lease `+tok(e2, 1)+` has already published`, []byte("again"),
			tokenArgs("publish", res, l)...)
		tg.wantRefused(fmt.Sprintf("lease %s names the wrong epoch: this owner acquired generation 1 in epoch %d (token %s)", tok(e1, 1), e2, tok(e2, 1)),
			[]byte("x"), leaseArgs("publish", res, l, "--epoch", strconv.FormatInt(e1, 10))...)
		tg.wantRefused("names the wrong epoch", nil, append(leaseArgs("renew", res, l, "--ttl", "30s"), "--epoch", strconv.FormatInt(e1, 10))...)
		if msg := tg.fails(3, nil, "acquire", res, "--ttl", "30s"); !strings.Contains(msg, "busy: lease "+tok(e2, 1)+" is held until") {
			t.Errorf("busy: %q", msg)
		}
		if st := tg.show(res); st.Owner == nil || *st.Owner != l.Owner || !st.Held || st.PublishedGeneration != 1 ||
			st.PublishedEpoch != e2 || st.PayloadBytes != int64(len(payload)) {
			t.Errorf("refusals changed the row: %+v", st)
		}
		released := string(tg.ok(nil, leaseArgs("release", res, l)...))
		if !strings.Contains(released, `"token":"`+tok(e2, 1)+`"`) {
			t.Errorf("release printed %s", released)
		}

		// publish --release and release with --token.
		l2 := tg.acquire(res, "30s")
		tg.ok([]byte("second"), tokenArgs("publish", res, l2, "--release")...)
		l3 := tg.acquire(res, "30s")
		if l3.Token != tok(e2, 3) {
			t.Fatalf("third acquisition: %+v", l3)
		}
		tg.ok(nil, tokenArgs("release", res, l3)...)
		// A released holder given by owner and generation: the epoch is not known for a
		// generation the row no longer shows, so the message names the generation only.
		tg.wantRefused("renew \"nightly report é\" refused: generation 1 was superseded by lease "+tok(e2, 3), nil,
			leaseArgs("renew", res, l, "--ttl", "30s")...)
		tg.wantRefused("lease "+tok(e2, 1)+" was superseded by lease "+tok(e2, 3), nil, tokenArgs("release", res, l)...)

		// The lease from before the bump: nothing superseded it, the bump freed it.
		bumped := fmt.Sprintf("lease %s was acquired before the epoch was bumped to %d", tok(e1, 2), e2)
		tg.wantRefused(bumped, []byte("stale"), leaseArgs("publish", old, stale)...)
		tg.wantRefused(bumped, []byte("stale"), tokenArgs("publish", old, stale, "--release")...)
		tg.wantRefused(bumped, nil, tokenArgs("renew", old, stale, "--ttl", "30s")...)
		tg.wantRefused(bumped, nil, leaseArgs("renew", old, stale, "--ttl", "30s")...)
		tg.wantRefused(bumped, nil, leaseArgs("release", old, stale)...)
		n := tg.acquire(old, "30s")
		if n.Token != tok(e2, 3) {
			t.Fatalf("acquired %+v after the bump", n)
		}
		tg.wantRefused("lease "+tok(e1, 2)+" was superseded by lease "+tok(e2, 3), []byte("stale"), tokenArgs("publish", old, stale)...)
		tg.wantRefused("generation 2 was superseded by lease "+tok(e2, 3), []byte("stale"), leaseArgs("publish", old, stale)...)
		if st := tg.show(old); st.Owner == nil || *st.Owner != n.Owner || st.PublishedGeneration != 0 {
			t.Errorf("the stale lease changed the row: %+v", st)
		}
		tg.ok(payload, leaseArgs("publish", old, n, "--release")...)
	})
}

// tok formats a token as the CLI prints it.
func tok(epoch, generation int64) string { return fmt.Sprintf("%d.%d", epoch, generation) }

// TestTokenFlags: a malformed or conflicting token is a usage error (exit 2) that names the
// problem, and nothing is sent: the payload is not published.
func TestTokenFlags(t *testing.T) {
	tg := runTarget(t)
	tg.ok(nil, "epoch", "bump")
	l := tg.acquire("job", "1m")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--token", "2"}, `invalid --token: "2" has no dot; write EPOCH.GENERATION, for example 2.1`},
		{[]string{"--token", ""}, `invalid --token: "" has no dot`},
		{[]string{"--token", "2.x"}, `invalid --token: "2.x": the generation "x" is not a positive integer`},
		{[]string{"--token", "0.1"}, `the epoch "0" is not a positive integer`},
		{[]string{"--token", "-2.1"}, `the epoch "-2" is not a positive integer`},
		{[]string{"--token", "02.1"}, `the epoch "02" has a leading zero`},
		{[]string{"--token", "2.1.1"}, `the generation "1.1" is not a positive integer`},
		{[]string{"--token", "2.99999999999999999999"}, `is too large`},
		{[]string{"--token", "2.1", "--generation", "1"}, "either as --token or as --generation and --epoch, not both"},
		{[]string{"--token", "2.1", "--epoch", "2"}, "not both"},
		{nil, "missing --token or --generation"},
		{[]string{"--epoch", "2"}, "missing --token or --generation"},
		{[]string{"--generation", "1", "--epoch", "0"}, `invalid --epoch "0": it must be a positive integer`},
		{[]string{"--generation", "1", "--epoch", "x"}, `invalid --epoch "x"`},
	} {
		args := append([]string{"publish", "job", "--owner", l.Owner}, c.args...)
		if msg := tg.fails(2, []byte("must not be written"), args...); !strings.Contains(msg, c.want) {
			t.Errorf("%v: %q, want it to say %q", c.args, msg, c.want)
		}
		for _, op := range [][]string{{"renew", "job", "--ttl", "1m"}, {"release", "job"}} {
			tg.fails(2, nil, append(append(op, "--owner", l.Owner), c.args...)...)
		}
	}
	if st := tg.show("job"); st.PublishedGeneration != 0 || st.Owner == nil || *st.Owner != l.Owner {
		t.Fatalf("a rejected command line changed the row: %+v", st)
	}
}

// TestRunPassesTheToken: after a bump, fenced run hands the command the whole token, which the
// command can present to fenced itself.
func TestRunPassesTheToken(t *testing.T) {
	tg := runTarget(t)
	e := decode[struct {
		Epoch int64 `json:"epoch"`
	}](t, tg.ok(nil, "epoch", "bump")).Epoch
	for range 2 { // generations 1 and 2 in the new epoch, so that run gets generation 3
		tg.ok(nil, leaseArgs("release", "job", tg.acquire("job", "1m"))...)
	}
	script := fmt.Sprintf(`echo "$FENCED_TOKEN $FENCED_EPOCH $FENCED_GENERATION"
%s renew "$FENCED_RESOURCE" --owner "$FENCED_OWNER" --token "$FENCED_TOKEN" --ttl 30s >&2 || exit 9
%s renew "$FENCED_RESOURCE" --owner "$FENCED_OWNER" --generation "$FENCED_GENERATION" --ttl 30s >&2 || exit 9`,
		strconv.Quote(bin), strconv.Quote(bin))
	r := tg.run(nil, "run", "job", "--ttl", "30s", "--", "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(string(r.stdout), `"token":"`+tok(e, 3)+`"`) || !strings.Contains(string(r.stdout), fmt.Sprintf(`"epoch":%d`, e)) {
		t.Errorf("run printed %s", r.stdout)
	}
	if got, want := string(tg.ok(nil, "get", "job")), fmt.Sprintf("%s %d 3\n", tok(e, 3), e); got != want {
		t.Fatalf("published %q", got)
	}
}
