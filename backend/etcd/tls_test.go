package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testcert"
)

// TestTLSAndAuth starts a one-member etcd that serves clients over TLS only, requires a client
// certificate signed by its CA, and has authentication enabled, then opens the driver through
// etcds:// URLs. The right CA, certificate and password work; a wrong password, an unknown
// server CA, a client certificate from another CA, none at all, and plain etcd:// against the
// TLS port are each an error, the certificate problems within 4 seconds (before the client's
// 5-second dial timeout), and no error repeats the password.
func TestTLSAndAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, other := testcert.NewCA(t, dir, "fenced-test-ca"), testcert.NewCA(t, dir, "other-ca")
	serverCert, serverKey := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.Issue(t, dir, "fenced-client", x509.ExtKeyUsageClientAuth)
	strangerCert, strangerKey := other.Issue(t, dir, "stranger", x509.ExtKeyUsageClientAuth)

	peerURL, err := freeLoopbackURL()
	if err != nil {
		t.Fatal(err)
	}
	clientURL, err := freeLoopbackURL()
	if err != nil {
		t.Fatal(err)
	}
	clientURL.Scheme = "https"
	cfg := embed.NewConfig()
	cfg.Name = "tls"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.InitialCluster = "tls=" + peerURL.String()
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: serverCert, KeyFile: serverKey, TrustedCAFile: ca.File, ClientCertAuth: true}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(testLogger())
	// The server checks every login with bcrypt. At etcd's default cost one check took most of
	// Open's 5-second dial timeout under -race on a loaded machine (wrong password: 4.7 s at load
	// 18), and a timeout there is reported as one, not as the refusal this test is about. The
	// least cost keeps the check a real bcrypt comparison of the password, 64 times cheaper.
	cfg.BcryptCost = uint(bcrypt.MinCost)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("the TLS member did not become ready")
	}

	const password = "Pw-s3cret-" + "x9"
	host := clientURL.Host
	{ // root with a password, then authentication on.
		pair, err := tls.LoadX509KeyPair(clientCert, clientKey)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{host}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err1 := cli.UserAdd(ctx, "root", password)
		_, err2 := cli.UserGrantRole(ctx, "root", "root")
		_, err3 := cli.AuthEnable(ctx)
		cancel()
		_ = cli.Close()
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("enable auth: %v, %v, %v", err1, err2, err3)
		}
	}

	q := url.Values{"ca": {ca.File}, "cert": {clientCert}, "key": {clientKey}, "prefix": {newPrefix()}}
	good := "etcds://root:" + password + "@" + host + "/?" + q.Encode()
	ctx := func() context.Context {
		c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		t.Cleanup(cancel)
		return c
	}
	d, err := Open(good)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	s, err := fenced.New(ctx(), d, &fenced.Config{AllowNonDurable: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.BumpEpoch(ctx()); err != nil {
		t.Fatal(err)
	}
	if err := s.Provision(ctx(), "tls ü/x"); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx(), "tls ü/x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.PublishAndRelease(ctx(), []byte("a\x00b")); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Get(ctx(), "tls ü/x"); err != nil || string(got) != "a\x00b" {
		t.Fatalf("get over TLS: %q, %v", got, err)
	}

	with := func(change func(q url.Values)) url.Values {
		c := url.Values{}
		for k, v := range q {
			c[k] = append([]string(nil), v...)
		}
		change(c)
		return c
	}
	for name, c := range map[string]struct{ url, want string }{
		"wrong password":     {"etcds://root:wrong-" + password + "@" + host + "/?" + q.Encode(), "authentication failed"},
		"no password":        {"etcds://" + host + "/?" + q.Encode(), "permission denied"},
		"unknown server CA":  {"etcds://root:" + password + "@" + host + "/?" + with(func(q url.Values) { q.Set("ca", other.File) }).Encode(), "unknown authority"},
		"stranger's cert":    {"etcds://root:" + password + "@" + host + "/?" + with(func(q url.Values) { q.Set("cert", strangerCert); q.Set("key", strangerKey) }).Encode(), "certificate required"},
		"no client cert":     {"etcds://root:" + password + "@" + host + "/?" + with(func(q url.Values) { q.Del("cert"); q.Del("key") }).Encode(), "certificate required"},
		"plain text":         {"etcd://root:" + password + "@" + host + "/?prefix=" + url.QueryEscape(q.Get("prefix")), "use etcds://"},
		"TLS params on etcd": {"etcd://root:" + password + "@" + host + "/?" + q.Encode(), "use etcds://"},
	} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			err := func() error {
				d, err := Open(c.url)
				if err != nil {
					return err
				}
				defer d.Close()
				_, err = fenced.New(ctx(), d, &fenced.Config{AllowNonDurable: true})
				return err
			}()
			if err == nil {
				t.Fatal("opened and used the store")
			}
			if took := time.Since(start); (strings.Contains(c.want, "certificate") || strings.Contains(c.want, "authority")) && took > 4*time.Second {
				t.Errorf("took %v: a certificate problem must not wait for the dial timeout (5s)", took)
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("the error repeats the password: %v", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v, want it to say %q", err, c.want)
			}
			if name == "wrong password" && !errors.Is(err, rpctypes.ErrAuthFailed) {
				t.Errorf("%v, want etcd's refusal (rpctypes.ErrAuthFailed), not a timeout", err)
			}
		})
	}
}
