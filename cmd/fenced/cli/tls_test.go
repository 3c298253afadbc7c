package cli_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/internal/testcert"
)

// refusedPromptly runs a command that must fail with code within limit, as one sentence
// containing every one of want and none of secrets, and returns that sentence.
func refusedPromptly(tg target, code int, limit time.Duration, want, secrets []string, args ...string) string {
	tg.t.Helper()
	start := time.Now()
	msg := tg.fails(code, nil, args...)
	if took := time.Since(start); took > limit {
		tg.t.Errorf("%s: took %v, over %v: a TLS failure must not read as a timeout", msg, took, limit)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			tg.t.Errorf("%q does not say %q", msg, w)
		}
	}
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			tg.t.Errorf("%q repeats the secret %q", msg, s)
		}
	}
	return msg
}

// roundTrip bumps the epoch (so that epoch != generation), provisions resource, acquires it and
// publishes a payload with a NUL byte under the lease, and returns the resource's state: what a
// connection that works must be able to do.
func (tg target) roundTrip(resource string) stateOut {
	tg.t.Helper()
	tg.ok(nil, "epoch", "bump")
	tg.ok(nil, "provision", resource)
	l := tg.acquire(resource, "1m")
	if l.Epoch == l.Generation {
		tg.t.Fatal("epoch equals generation")
	}
	tg.ok([]byte("a\x00b"), "publish", resource, "--owner", l.Owner, "--token", l.Token, "--release")
	if got := tg.ok(nil, "get", resource); string(got) != "a\x00b" {
		tg.t.Fatalf("get over TLS: %q", got)
	}
	return tg.show(resource)
}

// startRedisTLS runs a redis-server of the test's own that accepts only TLS connections (the
// plain port is off), on a free loopback port, with certFile and keyFile as its certificate,
// caFile as the CA of client certificates (required when clientCerts), a password, and the
// durable settings. It skips when redis-server is missing (fails under CI=true).
func startRedisTLS(t *testing.T, caFile, certFile, keyFile, password string, clientCerts bool) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed")
		}
		t.Skip("SKIP: redis-server is not installed")
	}
	port, dir := freePort(t), t.TempDir()
	auth := "no"
	if clientCerts {
		auth = "yes"
	}
	cmd := exec.Command(bin, "--port", "0", "--tls-port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", auth, "--requirepass", password, "--dir", dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxmemory-policy", "noeviction",
		"--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// waitRedisTLS polls the server, as the holder of a client certificate, until it answers.
func waitRedisTLS(t *testing.T, addr, password string, ca *x509.Certificate, certFile, keyFile string) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	c := goredis.NewClient(&goredis.Options{Addr: addr, Password: password, MaxRetries: -1,
		TLSConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the TLS redis-server on %s did not answer: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // polling until it listens
	}
}

// TestRedisTLS: a redis-server that speaks TLS only and requires a client certificate and a
// password is used through rediss:// with tls_ca, tls_cert and tls_key. A CA that did not sign
// the server's certificate, no CA (the system's roots), no client certificate, redis:// against
// the TLS port, TLS parameters on redis://, and a wrong password are each one sentence naming
// the problem, promptly (not a timeout), without the password or the key's path, and change
// nothing.
func TestRedisTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, other := testcert.NewCA(t, dir, "redis-ca"), testcert.NewCA(t, dir, "other-ca")
	serverCert, serverKey := ca.Issue(t, dir, "redis-server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.Issue(t, dir, "fenced-client", x509.ExtKeyUsageClientAuth)
	password := "Pw-" + rand.Text()
	addr := startRedisTLS(t, ca.File, serverCert, serverKey, password, true)

	q := url.Values{"tls_ca": {ca.File}, "tls_cert": {clientCert}, "tls_key": {clientKey}}
	with := func(change func(q url.Values)) string {
		c := url.Values{}
		for k, v := range q {
			c[k] = append([]string(nil), v...)
		}
		change(c)
		return c.Encode()
	}
	waitRedisTLS(t, addr, password, ca.Cert, clientCert, clientKey)
	good := "rediss://:" + url.QueryEscape(password) + "@" + addr + "/0?" + q.Encode()
	tg := target{t: t, url: good, dir: t.TempDir()}
	before := tg.roundTrip("tls ü/x")

	secrets := []string{password, clientKey}
	for _, c := range []struct {
		name, url string
		code      int
		want      []string
	}{
		{"wrong CA", "rediss://:" + password + "@" + addr + "/0?" + with(func(q url.Values) { q.Set("tls_ca", other.File) }),
			1, []string{addr, "unknown authority", "tls_ca"}},
		{"system roots", "rediss://:" + password + "@" + addr + "/0?" + with(func(q url.Values) { q.Del("tls_ca") }),
			1, []string{addr, "unknown authority", "tls_ca"}},
		{"no client certificate", "rediss://:" + password + "@" + addr + "/0?" + with(func(q url.Values) { q.Del("tls_cert"); q.Del("tls_key") }),
			1, []string{addr, "refused this client's certificate"}},
		{"plain text to the TLS port", "redis://:" + password + "@" + addr + "/0",
			1, []string{addr, "rediss://"}},
		{"TLS parameters on redis://", "redis://:" + password + "@" + addr + "/0?" + q.Encode(),
			1, []string{"use rediss://"}},
		{"wrong password", "rediss://:wrong-" + password + "@" + addr + "/0?" + q.Encode(),
			1, []string{"WRONGPASS"}},
		{"missing key file", "rediss://:" + password + "@" + addr + "/0?" + with(func(q url.Values) { q.Set("tls_key", clientKey+".gone") }),
			1, []string{"tls_key", "no such file"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := target{t: t, url: c.url, dir: tg.dir}
			refusedPromptly(bad, c.code, 4*time.Second, c.want, secrets, "acquire", "tls ü/x", "--ttl", "1m")
		})
	}
	if after := tg.show("tls ü/x"); after.Generation != before.Generation || after.Owner != nil {
		t.Errorf("the refused connections changed the resource: %+v, then %+v", before, after)
	}
}

// TestPostgresTLS: a cluster of the test's own that accepts TCP connections only over TLS
// (hostssl in pg_hba.conf, so a command that works used TLS), with a certificate from a CA the
// test made. sslmode=verify-full with sslrootcert works; a CA that did not sign the server's
// certificate and verify-full with the system's roots are one sentence naming the problem,
// promptly; sslmode=disable is refused by the server; and a URL that could fall back to plain
// text (no sslmode: pgx's prefer; allow) is refused before any connection for a host beyond
// loopback, while disable, require and verify-full are accepted there.
func TestPostgresTLS(t *testing.T) {
	t.Parallel()
	s := newPGServers(t)
	p := s.primary("tls")
	ca, other := testcert.NewCA(t, s.dir, "pg-ca"), testcert.NewCA(t, s.dir, "other-ca")
	cert, key := ca.Issue(t, s.dir, "pg-server", x509.ExtKeyUsageServerAuth)
	if s.uid >= 0 { // the server runs as postgres and refuses a key it cannot read as its own
		for _, f := range []string{cert, key} {
			if err := os.Chown(f, s.uid, s.gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	hba := "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 0.0.0.0/0 reject\n"
	if err := os.WriteFile(filepath.Join(p.data(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	p.startWith(fmt.Sprintf("-c ssl=on -c ssl_cert_file=%s -c ssl_key_file=%s", cert, key))

	base := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", p.port)
	good := target{t: t, url: base + "?" + url.Values{"sslmode": {"verify-full"}, "sslrootcert": {ca.File}}.Encode(), dir: t.TempDir()}
	before := good.roundTrip("tls ü/x")

	addr := fmt.Sprintf("127.0.0.1:%d", p.port)
	for _, c := range []struct {
		name, url string
		want      []string
	}{
		{"wrong CA", base + "?" + url.Values{"sslmode": {"verify-full"}, "sslrootcert": {other.File}}.Encode(),
			[]string{addr, "unknown authority", "sslrootcert"}},
		{"plain text", base + "?sslmode=disable", []string{addr, "no encryption"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			refusedPromptly(target{t: t, url: c.url, dir: good.dir}, 1, 4*time.Second, c.want, nil, "acquire", "tls ü/x", "--ttl", "1m")
		})
	}
	// Nothing listens on a TEST-NET address: a URL that is accepted is then a connection
	// failure, one that is refused names sslmode without dialling.
	const remote = "postgres://postgres@192.0.2.1:5432/postgres?connect_timeout=1"
	for _, c := range []struct{ query, want string }{
		{"", "sslmode"},
		{"&sslmode=prefer", "sslmode"},
		{"&sslmode=allow", "sslmode"},
		{"&sslmode=disable", "cannot connect"},
		{"&sslmode=require", "cannot connect"},
		{"&sslmode=verify-full&sslrootcert=" + url.QueryEscape(ca.File), "cannot connect"},
	} {
		// The limit covers a loaded machine's process start: these cases time the sslmode
		// refusal before any dial, not a TLS failure.
		msg := refusedPromptly(target{t: t, url: remote + c.query, dir: good.dir}, 1, 15*time.Second, []string{c.want}, nil, "show", "tls ü/x")
		if c.want == "sslmode" && !strings.Contains(msg, "plain text") {
			t.Errorf("sslmode%s: %q does not say it falls back to plain text", c.query, msg)
		}
	}
	if after := good.show("tls ü/x"); after.Generation != before.Generation || after.Owner != nil {
		t.Errorf("the refused connections changed the resource: %+v, then %+v", before, after)
	}
}

// TestMariaDBTLS: a private mariadbd with a certificate from a CA the test made, and a user
// that REQUIRE SSL (so a command that works used TLS), reached through mysql:// URLs alone.
// tls_ca (with tls=true or without tls) works; a CA that did not sign the server's
// certificate, tls=true against the system's roots, and no TLS at all are one sentence naming
// the problem, promptly, without the password; tls_ca with tls=skip-verify or preferred is
// refused.
func TestMariaDBTLS(t *testing.T) {
	t.Parallel()
	// Not t.TempDir: its parent is private to root, and mariadbd runs as mysql.
	dir, err := os.MkdirTemp("", "fenced-mariadb-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca, other := testcert.NewCA(t, dir, "mariadb-ca"), testcert.NewCA(t, dir, "other-ca")
	cert, key := ca.Issue(t, dir, "mariadb-server", x509.ExtKeyUsageServerAuth)
	if os.Geteuid() == 0 {
		u, err := user.Lookup("mysql")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, f := range []string{ca.File, cert, key} {
			if err := os.Chown(f, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	port, root := startMariaDB(t, "--ssl-ca="+ca.File, "--ssl-cert="+cert, "--ssl-key="+key)
	password := "Pw-" + rand.Text()
	mustExec(t, root, "CREATE DATABASE fenced_tls",
		"CREATE USER 'fenced_tls'@'%' IDENTIFIED BY '"+password+"' REQUIRE SSL",
		"GRANT ALL ON fenced_tls.* TO 'fenced_tls'@'%'")

	base := "mysql://fenced_tls:" + url.QueryEscape(password) + "@127.0.0.1:" + strconv.Itoa(port) + "/fenced_tls"
	good := target{t: t, url: base + "?" + url.Values{"tls_ca": {ca.File}}.Encode(), dir: t.TempDir()}
	good.roundTrip("tls ü/x")
	withTrue := target{t: t, url: base + "?" + url.Values{"tls": {"true"}, "tls_ca": {ca.File}}.Encode(), dir: good.dir}
	before := withTrue.roundTrip("tls ü/x")

	addr := "127.0.0.1:" + strconv.Itoa(port)
	for _, c := range []struct {
		name, query string
		want        []string
	}{
		{"wrong CA", url.Values{"tls_ca": {other.File}}.Encode(), []string{addr, "unknown authority", "tls_ca"}},
		{"system roots", "tls=true", []string{addr, "unknown authority", "tls_ca"}},
		{"plain text", "", []string{addr, "Access denied"}},
		{"skip-verify with a CA", url.Values{"tls": {"skip-verify"}, "tls_ca": {ca.File}}.Encode(), []string{"tls=skip-verify", "tls_ca"}},
		{"preferred", "tls=preferred", []string{"plain text"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			refusedPromptly(target{t: t, url: base + "?" + c.query, dir: good.dir}, 1, 4*time.Second, c.want, []string{password}, "acquire", "tls ü/x", "--ttl", "1m")
		})
	}
	if after := good.show("tls ü/x"); after.Generation != before.Generation || after.Owner != nil {
		t.Errorf("the refused connections changed the resource: %+v, then %+v", before, after)
	}
}
