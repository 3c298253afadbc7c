package mysql_test

import (
	"context"
	"io"
	"log"
	"net"
	"net/url"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

func TestMain(m *testing.M) {
	// The lost-reply and restart tests break connections on purpose; go-sql-driver would log
	// each one ("unexpected EOF"), and the error the test checks is the one returned.
	_ = gomysql.SetLogger(log.New(io.Discard, "", 0))
	goleak.VerifyTestMain(m)
}

// open returns a driver on a pool of its own, closed when t ends.
func open(t testing.TB, rawURL string) *mysql.Driver {
	t.Helper()
	d, err := mysql.Open(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// expireSQL moves a lease's expiry a second into the past on the server's clock.
const expireSQL = `UPDATE fenced_resources SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND
WHERE resource = ? AND lease_until IS NOT NULL`

// newTarget gives each test its own database; every Open is a pool of its own.
func newTarget(t *testing.T) drivertest.Target {
	dbURL := mysql.CreateTestDatabase(t)
	admin := open(t, dbURL)
	return drivertest.Target{
		Open: func(t *testing.T) driver.Driver { return open(t, dbURL) },
		Expire: func(ctx context.Context, resource string) error {
			_, err := admin.DB().ExecContext(ctx, expireSQL, resource)
			return err
		},
		LostReply: func(t *testing.T) (driver.Driver, func()) {
			proxy := drivertest.StartProxy(t, hostPort(t, dbURL))
			return open(t, withHost(t, dbURL, proxy.Addr())), proxy.LoseNextReply
		},
		Unreachable: func(t *testing.T) driver.Driver {
			return open(t, withHost(t, dbURL, drivertest.ClosedAddr(t)))
		},
		LoseEverything: func(ctx context.Context) error { return mysql.RecreateTestDatabase(ctx, dbURL) },
		SetEpoch:       setEpochWith(admin),
		HoldRowLock:    holdRowLock(admin.DB()),
	}
}

// setEpochWith overwrites the store's epoch, as a store created before epochs came from the
// clock holds a small one.
func setEpochWith(admin *mysql.Driver) func(ctx context.Context, epoch int64) error {
	return func(ctx context.Context, epoch int64) error {
		_, err := admin.DB().ExecContext(ctx, "UPDATE fenced_meta SET epoch = ?", epoch)
		return err
	}
}

// hostPort is the server's address in a mysql:// URL.
func hostPort(t testing.TB, rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	if port == "" {
		port = "3306"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// withHost points a mysql:// URL at another address.
func withHost(t testing.TB, rawURL, addr string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

func TestConformance(t *testing.T) { drivertest.Run(t, newTarget) }
