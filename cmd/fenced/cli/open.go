package cli

import (
	"context"
	"net/http"
	neturl "net/url"
	"os"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/backend/remote"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/backend/sqlserver"
	"github.com/fenced-dev/fenced/driver"
)

// quietLogger discards go-redis's log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// defaultDB is used when neither --db nor FENCED_DB is set: a file in the current directory.
const defaultDB = "sqlite:fenced.db"

const schemes = "sqlite:PATH, postgres://, mysql://, sqlserver://, etcd://host:port[,host:port], etcds:// (TLS), redis:// or rediss:// (TLS), or a fenced service's http:// or https:// (bearer secret in $FENCED_API_TOKEN)"

// dbHelp describes the URL forms in the help text.
const dbHelp = `database URL: ` + schemes + ` (default: $FENCED_DB, else sqlite:fenced.db)`

// openDriver maps the URL's scheme to a backend. It is the one place that knows every backend.
func openDriver(ctx context.Context, url string) (driver.Driver, error) {
	scheme, _, ok := strings.Cut(url, ":")
	if !ok || scheme == "" {
		return nil, usagef("the database URL has no scheme; use %s", schemes)
	}
	switch strings.ToLower(scheme) {
	case "sqlite":
		return sqlite.OpenURL(url)
	case "postgres", "postgresql":
		return postgres.Open(ctx, url)
	case "mysql", "mariadb":
		return mysql.Open(url)
	case "sqlserver":
		return sqlserver.Open(url)
	case "etcd", "etcds":
		return etcd.Open(url)
	case "redis", "rediss":
		// go-redis logs its own connection failures on stderr, beside the one sentence the
		// command prints. The logger is global to the process, which the CLI owns; the
		// backend leaves it alone, as a library must.
		goredis.SetLogger(quietLogger{})
		return redis.Open(url)
	case "http", "https":
		return openService(url)
	default:
		// Only the scheme is quoted: the rest of a URL may hold a password.
		return nil, usagef("the database URL scheme %q is not supported; use %s", scheme, schemes)
	}
}

// openService opens a client of a fenced service. Its transport is the remote driver's
// SyncTransport (each request written and its answer read on the calling goroutine, HTTP/1.1)
// unless a proxy from the environment applies to the URL, which only net/http's transport
// follows, or the URL's query says transport=standard; transport=sync asks for it even past a
// proxy (the connection then goes to the service directly).
func openService(rawURL string) (driver.Driver, error) {
	u, err := neturl.Parse(rawURL)
	if err != nil {
		return nil, usagef("invalid service URL: %v", err)
	}
	q := u.Query()
	choice := q.Get("transport")
	q.Del("transport")
	if len(q) > 0 {
		return nil, usagef("the service URL's query may hold only transport=sync or transport=standard")
	}
	direct := false
	switch choice {
	case "sync":
		direct = true
	case "standard":
	case "":
		proxy, err := http.ProxyFromEnvironment(&http.Request{URL: u})
		if err != nil {
			return nil, usagef("the proxy settings in the environment are invalid: %v", err)
		}
		direct = proxy == nil
	default:
		return nil, usagef("transport=%q in the service URL: use transport=sync or transport=standard", choice)
	}
	u.RawQuery, u.ForceQuery = "", false
	return remote.Open(u.String(), &remote.Options{BearerToken: os.Getenv("FENCED_API_TOKEN"), SyncTransport: direct})
}
