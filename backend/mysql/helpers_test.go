package mysql

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/driver/drivertest"
)

// TestURLEnv names the variable that points the tests at a server; any database on it works
// (each test creates and drops its own).
const (
	TestURLEnv     = "FENCED_TEST_MYSQL"
	defaultTestURL = "mysql://root@127.0.0.1:3306/test"
)

// CreateTestDatabase creates a database with a random name on the test server, drops it when tb
// ends, and returns its URL. It skips (or fails under CI) when no server answers.
func CreateTestDatabase(tb testing.TB) string {
	tb.Helper()
	server := drivertest.ServerURL(tb, TestURLEnv, defaultTestURL, ping)
	name := "fenced_" + strings.ToLower(rand.Text()[:16])
	if err := adminExec(server, "CREATE DATABASE `"+name+"`"); err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	tb.Cleanup(func() {
		if err := adminExec(server, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			tb.Errorf("drop test database %s: %v", name, err)
		}
	})
	u, err := url.Parse(server)
	if err != nil {
		tb.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// RecreateTestDatabase drops the database dbURL names, with everything in it, and creates it
// empty: a total loss of the store.
func RecreateTestDatabase(ctx context.Context, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	name := strings.TrimPrefix(u.Path, "/")
	d, err := Open(dbURL)
	if err != nil {
		return err
	}
	defer d.Close()
	conn, err := d.DB().Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "DROP DATABASE `"+name+"`"); err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, "CREATE DATABASE `"+name+"`")
	return err
}

// WithParam returns rawURL with one more query parameter.
func WithParam(tb testing.TB, rawURL, key, value string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		tb.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func adminExec(server, stmt string) error {
	d, err := Open(server)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = d.DB().ExecContext(ctx, stmt)
	return err
}

func ping(server string) error {
	d, err := Open(server)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := d.DB().PingContext(ctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}
