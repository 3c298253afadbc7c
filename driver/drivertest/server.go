package drivertest

import (
	"net"
	neturl "net/url"
	"os"
	"testing"
	"time"
)

// ServerURL returns the URL of a database server for tests: the environment variable envVar,
// else def (a localhost address). ping checks that the server answers. When it does not, the
// test is skipped with a loud message on a developer's machine and fails under CI (CI=true),
// where every server the tests need must be up.
func ServerURL(t testing.TB, envVar, def string, ping func(url string) error) string {
	t.Helper()
	url := os.Getenv(envVar)
	if url == "" {
		url = def
	}
	if err := ping(url); err != nil {
		msg := "!!! " + envVar + "=" + url + " is not reachable (" + err.Error() + "); " +
			"set " + envVar + " to a server to run these tests"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return url
}

// DialURL is a ping for ServerURL: it succeeds when the host of the URL raw accepts a TCP
// connection within two seconds (an HTTP endpoint such as Azurite's, for example).
func DialURL(raw string) error {
	u, err := neturl.Parse(raw)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}
