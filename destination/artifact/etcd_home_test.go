package artifact

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/driver/drivertest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcd as the pointers' home: one embedded member on loopback, started on first use and
// stopped by TestMain, unless FENCED_TEST_ETCD names a server; each test gets a key prefix of
// its own.
var etcdServer struct {
	once     sync.Once
	e        *embed.Etcd
	dir      string
	endpoint string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if etcdServer.e != nil {
		etcdServer.e.Close()
		_ = os.RemoveAll(etcdServer.dir)
	}
	os.Exit(code)
}

func freeLoopbackURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

func startEtcd() {
	s := &etcdServer
	if s.dir, s.err = os.MkdirTemp("", "fenced-artifact-etcd-"); s.err != nil {
		return
	}
	peer, err := freeLoopbackURL()
	if err != nil {
		s.err = err
		return
	}
	client, err := freeLoopbackURL()
	if err != nil {
		s.err = err
		return
	}
	cfg := embed.NewConfig()
	cfg.Name = "m0"
	cfg.Dir = s.dir
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if s.e, s.err = embed.StartEtcd(cfg); s.err != nil {
		return
	}
	select {
	case <-s.e.Server.ReadyNotify():
		s.endpoint = client.Host
	case s.err = <-s.e.Err():
	case <-time.After(30 * time.Second):
		s.err = fmt.Errorf("the embedded etcd member did not become ready")
	}
}

// etcdEndpoint is the server FENCED_TEST_ETCD names (etcd://host:port) when it is set, else
// the embedded member. BenchmarkArtifact sets it: an embedded member's memory would count in
// the process's peak RSS.
func etcdEndpoint(t testing.TB) string {
	if raw := os.Getenv("FENCED_TEST_ETCD"); raw != "" {
		drivertest.ServerURL(t, "FENCED_TEST_ETCD", raw, drivertest.DialURL)
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("FENCED_TEST_ETCD=%s: %v", raw, err)
		}
		return u.Host
	}
	etcdServer.once.Do(startEtcd)
	if etcdServer.err != nil {
		t.Fatalf("start an embedded etcd member: %v", etcdServer.err)
	}
	return etcdServer.endpoint
}

func etcdHome(t testing.TB) home {
	endpoint := etcdEndpoint(t)
	prefix := "/fenced-artifact-test/" + rand.Text() + "/"
	rawURL := "etcd://" + endpoint + "?prefix=" + url.QueryEscape(prefix)
	open := func(t testing.TB) *etcd.Driver {
		d, err := etcd.Open(rawURL)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
			t.Errorf("delete test keys: %v", err)
		}
		_ = admin.Close()
	})
	return home{
		name: "etcd",
		open: func(t testing.TB) (*fenced.Store, *fenced.Store, func()) {
			lossy, arm := drivertest.LoseReplies(open(t))
			return newStore(t, open(t)), newStore(t, lossy), arm
		},
		// What etcd does when the lease's TTL runs out: the owner key (documented in the etcd
		// backend's key layout) goes, and its etcd lease is revoked.
		expire: func(ctx context.Context, resource string) error {
			owner := prefix + resource + "/owner"
			resp, err := admin.Txn(ctx).Then(clientv3.OpGet(owner), clientv3.OpDelete(owner)).Commit()
			if err != nil {
				return err
			}
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && kvs[0].Lease != 0 {
				_, err = admin.Revoke(ctx, clientv3.LeaseID(kvs[0].Lease))
			}
			return err
		},
	}
}
