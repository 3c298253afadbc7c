package etcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// testCluster is a three-member etcd cluster embedded in the test binary, on loopback ports
// chosen at run time, with its data under one temporary directory.
type testCluster struct {
	dir     string
	initial string // --initial-cluster
	mu      sync.Mutex
	members []*member
}

type member struct {
	name               string
	peerURL, clientURL url.URL
	etcd               *embed.Etcd // nil while stopped
}

// testMaxRequestBytes lets the suite publish its 1 MiB payload (etcd's default is 1.5 MiB
// including everything else in the request; the suite's limit check sends 1 MiB + 1).
const testMaxRequestBytes = 4 << 20

func freeLoopbackURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

func startCluster(n int) (*testCluster, error) {
	dir, err := os.MkdirTemp("", "fenced-etcd-")
	if err != nil {
		return nil, err
	}
	c := &testCluster{dir: dir}
	var initial []string
	for i := range n {
		m := &member{name: fmt.Sprintf("m%d", i)}
		if m.peerURL, err = freeLoopbackURL(); err != nil {
			return nil, err
		}
		if m.clientURL, err = freeLoopbackURL(); err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	c.initial = strings.Join(initial, ",")
	for i := range c.members {
		if err := c.start(i); err != nil {
			c.close()
			return nil, err
		}
	}
	for i := range c.members {
		if err := c.waitReady(i); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

func (c *testCluster) config(m *member) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = filepath.Join(c.dir, m.name)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{m.peerURL}, []url.URL{m.peerURL}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{m.clientURL}, []url.URL{m.clientURL}
	cfg.InitialCluster = c.initial
	cfg.InitialClusterToken = "fenced-test"
	cfg.ClusterState = embed.ClusterStateFlagNew // ignored on restart: the WAL has the membership
	cfg.MaxRequestBytes = testMaxRequestBytes
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(testLogger())
	return cfg
}

// testLogger is silent unless FENCED_ETCD_LOG is set, for debugging a failing run.
func testLogger() *zap.Logger {
	if os.Getenv("FENCED_ETCD_LOG") == "" {
		return zap.NewNop()
	}
	lg, err := zap.NewDevelopment()
	if err != nil {
		return zap.NewNop()
	}
	return lg
}

// start starts (or restarts, on its existing data) member i; it does not wait for it to join.
func (c *testCluster) start(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[i]
	e, err := embed.StartEtcd(c.config(m))
	if err != nil {
		return fmt.Errorf("start member %s: %w", m.name, err)
	}
	m.etcd = e
	return nil
}

func (c *testCluster) waitReady(i int) error {
	c.mu.Lock()
	e := c.members[i].etcd
	c.mu.Unlock()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("member %s: %w", c.members[i].name, err)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("member %s did not become ready", c.members[i].name)
	}
}

// kill stops member i at once, without handing over leadership: the others notice only by
// missing heartbeats, as after a crash.
func (c *testCluster) kill(i int) {
	c.mu.Lock()
	e := c.members[i].etcd
	c.members[i].etcd = nil
	c.mu.Unlock()
	e.Server.HardStop()
	e.Close()
}

// leader returns the index of the member that the running members agree leads, waiting
// (by polling their Raft state, never by a fixed sleep) until they do.
func (c *testCluster) leader(ctx context.Context) (int, error) {
	for {
		c.mu.Lock()
		lead, agree, running := uint64(0), true, 0
		idx := -1
		for i, m := range c.members {
			if m.etcd == nil {
				continue
			}
			running++
			l := uint64(m.etcd.Server.Leader())
			if lead == 0 {
				lead = l
			}
			agree = agree && l == lead && l != 0
			if uint64(m.etcd.Server.MemberID()) == l {
				idx = i
			}
		}
		c.mu.Unlock()
		if agree && idx >= 0 && running > 0 {
			return idx, nil
		}
		select {
		case <-ctx.Done():
			return -1, errors.New("no agreed leader among the running members")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// endpoints lists the client URLs of the members, except those in skip.
func (c *testCluster) endpoints(skip ...int) []string {
	var eps []string
	for i, m := range c.members {
		if !contains(skip, i) {
			eps = append(eps, m.clientURL.Host)
		}
	}
	return eps
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// etcdURL is an Open URL for the given endpoints and key prefix.
func etcdURL(endpoints []string, prefix string) string {
	return "etcd://" + strings.Join(endpoints, ",") + "?prefix=" + url.QueryEscape(prefix)
}

func newClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	return newClientWith(t, endpoints)
}

// newClientWith is a client with the driver's dial options and more.
func newClientWith(t testing.TB, endpoints []string, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: append(DialOptions(), opts...)})
	if err != nil {
		t.Fatalf("new etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func (c *testCluster) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.etcd != nil {
			m.etcd.Close()
			m.etcd = nil
		}
	}
	_ = os.RemoveAll(c.dir)
}
