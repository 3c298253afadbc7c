package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

// defaultPorts are the ports a URL without one means, by scheme.
var defaultPorts = map[string]string{"postgres": "5432", "postgresql": "5432", "mysql": "3306", "mariadb": "3306",
	"redis": "6379", "rediss": "6379", "etcd": "2379", "etcds": "2379", "sqlserver": "1433", "http": "80", "https": "443"}

// urlHosts splits a database URL around its addresses: scheme://[userinfo@]host:port[,host:port…][/…].
// Each address gets its port (the scheme's default when the URL has none). An error says why
// the URL has no TCP address (SQLite, a Unix socket).
func urlHosts(rawURL string) (prefix string, addrs []string, suffix string, err error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return "", nil, "", errors.New("the database URL names no host:port (a file or a socket has no network to delay)")
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	prefix = scheme + "://"
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		prefix += authority[:at+1]
		authority = authority[at+1:]
	}
	if authority == "" {
		return "", nil, "", errors.New("the database URL names no host (a Unix socket has no network to delay)")
	}
	for _, h := range strings.Split(authority, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			port, ok := defaultPorts[strings.ToLower(scheme)]
			if !ok {
				return "", nil, "", fmt.Errorf("the database URL's address %q has no port", h)
			}
			h = net.JoinHostPort(strings.Trim(h, "[]"), port)
		}
		addrs = append(addrs, h)
	}
	return prefix, addrs, rest[end:], nil
}

// delayApplies says whether the delay fault can put a proxy before the database of rawURL.
func delayApplies(scheme, rawURL string) error {
	if scheme == "sqlite" {
		return errors.New("not applicable to SQLite: it is embedded in each process, there is no network between the workers and the database")
	}
	_, _, _, err := urlHosts(rawURL)
	return err
}

// startProxies starts one proxy per address of rawURL and returns them with the URL the
// workers use instead: the same, with each address replaced by its proxy's.
func startProxies(rawURL string, seed uint64) ([]*torture.Proxy, string, error) {
	prefix, addrs, suffix, err := urlHosts(rawURL)
	if err != nil {
		return nil, "", err
	}
	var proxies []*torture.Proxy
	var via []string
	for i, a := range addrs {
		p, err := torture.NewProxy(a, seed+uint64(i))
		if err != nil {
			for _, q := range proxies {
				_ = q.Close()
			}
			return nil, "", err
		}
		proxies = append(proxies, p)
		via = append(via, p.Addr())
	}
	return proxies, prefix + strings.Join(via, ",") + suffix, nil
}

// delay is the delay fault: through the proxies between the workers and the server, every
// byte late by a latency with jitter for f.For, or about half the connections stalled for
// f.For (longer than any TTL), or about half of them reset.
func (t *tortureRun) delay(ctx context.Context, f torture.Fault) {
	begin := torture.Now()
	var detail string
	switch f.Mode {
	case torture.DelayLatency:
		for _, p := range t.proxies {
			p.SetLatency(f.Latency, f.Jitter)
		}
		wait(ctx, f.For)
		for _, p := range t.proxies {
			p.SetLatency(0, 0)
		}
		detail = fmt.Sprintf("latency: every byte %s ± %s late each way for %s", f.Latency, f.Jitter, f.For.Round(time.Millisecond))
	case torture.DelayStall:
		stalled, open := 0, 0
		for _, p := range t.proxies {
			s, o := p.Stall(f.For, 0.5)
			stalled, open = stalled+s, open+o
		}
		wait(ctx, f.For) // the stall ends by itself; this keeps the next fault after it
		detail = fmt.Sprintf("stall: %d of %d connections passed nothing for %s", stalled, open, f.For.Round(time.Millisecond))
	case torture.DelayReset:
		reset, open := 0, 0
		for _, p := range t.proxies {
			r, o := p.Reset(0.5)
			reset, open = reset+r, open+o
		}
		detail = fmt.Sprintf("reset: %d of %d connections reset (RST to both sides)", reset, open)
	}
	_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultDelay, Time: begin, EndTime: torture.Now(), Detail: detail})
}

// proxyNote is the line torture prints about its proxies.
func proxyNote(proxies []*torture.Proxy) string {
	var addrs []string
	for _, p := range proxies {
		addrs = append(addrs, p.Addr())
	}
	return "delay fault: the workers reach the database through a proxy on " + strings.Join(addrs, ",") +
		" (the reader and the nemesis do not)"
}
