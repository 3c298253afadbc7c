package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/driver"
)

// restartFunc restarts the database server and returns once it accepts connections again.
type restartFunc func(ctx context.Context) error

// serverRestart returns how torture's restart fault restarts the server behind rawURL, or why
// it cannot: only servers on this machine, started the way this machine starts them.
func serverRestart(scheme, rawURL string) (restartFunc, error) {
	switch scheme {
	case "sqlite":
		return nil, errors.New("not applicable to SQLite: it is embedded in each process, there is no server to restart (kill -9 of a worker is its crash)")
	case "postgres", "postgresql":
		if err := onThisMachine(rawURL); err != nil {
			return nil, err
		}
		if _, err := exec.LookPath("pg_ctlcluster"); err != nil {
			return nil, errors.New("restart needs pg_ctlcluster (a PostgreSQL server on this machine)")
		}
		if _, err := pgVersion(); err != nil {
			return nil, err
		}
		return restartPostgres, nil
	case "mysql", "mariadb":
		if err := onThisMachine(rawURL); err != nil {
			return nil, err
		}
		if _, err := exec.LookPath("start-stop-daemon"); err != nil {
			return nil, errors.New("restart needs start-stop-daemon to start MariaDB again")
		}
		if _, err := os.Stat(mariadbd); err != nil {
			return nil, fmt.Errorf("restart needs the MariaDB server at %s on this machine", mariadbd)
		}
		return func(ctx context.Context) error { return restartMariaDB(ctx, rawURL) }, nil
	case "redis", "rediss":
		return nil, errors.New("needs --restart-cmd for Redis: the server's start-up configuration cannot be read back to start it again (and a Redis without appendfsync always loses acknowledged generations in a crash by design)")
	default:
		return nil, errors.New("needs --restart-cmd for " + scheme + ": torture cannot start its server again by itself")
	}
}

// commandRestart is the restart fault through the user's command (sh -c): it must restart the
// server, or crash it and start it again from its data; torture then waits until the URL's
// address accepts connections.
func commandRestart(scheme, rawURL, command string) (restartFunc, error) {
	if scheme == "sqlite" {
		return nil, errors.New("not applicable to SQLite: it is embedded in each process, there is no server to restart")
	}
	addr, err := portToWait(rawURL, "restart")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "sh", "-c", command).CombinedOutput()
		if err != nil {
			return fmt.Errorf("restart command: %w: %s", err, strings.TrimSpace(string(out)))
		}
		if err := waitPort(ctx, addr, true); err != nil {
			return fmt.Errorf("restart command: the server did not come back: %w", err)
		}
		return nil
	}, nil
}

// serverStart names the running server's start where that is cheap and certain:
// PostgreSQL's pg_postmaster_start_time() and Redis's run_id, both new at every start of the
// server. ok is false for the other engines (MariaDB's uptime counts whole seconds; etcd and
// SQL Server report no start through their clients without extra permissions): their
// restarts are confirmed only by the restart command's exit and, for MariaDB restarted by
// torture itself, by its port closing and opening again.
func serverStart(ctx context.Context, drv driver.Driver) (start string, ok bool, err error) {
	switch d := drv.(type) {
	case *postgres.Driver:
		err = d.Pool().QueryRow(ctx, "SELECT pg_postmaster_start_time()::text").Scan(&start)
		return start, true, err
	case *redis.Driver:
		info, err := d.Client().Info(ctx, "server").Result()
		if err != nil {
			return "", true, err
		}
		for line := range strings.Lines(info) {
			if id, found := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); found {
				return id, true, nil
			}
		}
		return "", true, errors.New("INFO server names no run_id")
	}
	return "", false, nil
}

// errNotRestarted is restartLanded's answer when the server's start never changed: the
// server certainly did not restart.
var errNotRestarted = errors.New("the server did not restart")

// restartLanded checks, after a restart that reported success, that the server's start
// changed from before (serverStart). It asks again for up to 15 s: the first requests after a
// restart may go to connections the restart closed, or to the server before a restart command
// that returned early has stopped it.
func restartLanded(ctx context.Context, drv driver.Driver, before string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	sameStart := false
	for {
		after, _, err := serverStart(ctx, drv)
		if err == nil && after != before {
			return nil
		}
		sameStart = err == nil
		select {
		case <-ctx.Done():
			if sameStart {
				return fmt.Errorf("%w: its start (%s) is the same as before", errNotRestarted, before)
			}
			return fmt.Errorf("the restart is not confirmed: the server's start could not be read after it: %w", err)
		case <-time.After(100 * time.Millisecond): // polling the server's state, not ordering work
		}
	}
}

// portToWait is the address whose port torture waits for after the server was restarted (or
// restored, the fault named by what): the URL's first endpoint.
func portToWait(rawURL, what string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("the database URL names no host:port to wait for after the %s", what)
	}
	// etcd URLs list endpoints separated by commas: wait for the first.
	addr, _, _ := strings.Cut(u.Host, ",")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("the database URL's address %q has no port to wait for after the %s", addr, what)
	}
	return addr, nil
}

// onThisMachine refuses a server that is not on a loopback address.
func onThisMachine(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return errors.New("restart: the database URL cannot be parsed")
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return errors.New("restart applies only to a server on this machine (a loopback address)")
	}
	return nil
}

// pgVersion is the one cluster version under /etc/postgresql, for pg_ctlcluster.
func pgVersion() (string, error) {
	entries, err := os.ReadDir("/etc/postgresql")
	if err != nil || len(entries) != 1 {
		return "", errors.New("restart needs exactly one PostgreSQL cluster version under /etc/postgresql on this machine")
	}
	return entries[0].Name(), nil
}

func restartPostgres(ctx context.Context) error {
	v, err := pgVersion()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "pg_ctlcluster", "--skip-systemctl-redirect", v, "main", "restart").CombinedOutput()
	if err != nil {
		return fmt.Errorf("restart postgresql: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

const mariadbd = "/usr/sbin/mariadbd"

// restartMariaDB shuts the server down with SHUTDOWN over the store's own URL (InnoDB flushes
// and stops cleanly, as in a service restart), waits until its port is closed, and starts the
// server binary again as this machine's start-up does.
func restartMariaDB(ctx context.Context, rawURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	d, err := mysql.Open(rawURL)
	if err != nil {
		return fmt.Errorf("restart mariadb: %w", err)
	}
	_, err = d.DB().ExecContext(ctx, "SHUTDOWN")
	_ = d.Close()
	if err != nil {
		return fmt.Errorf("restart mariadb: shutdown: %w", err)
	}
	if err := waitPort(ctx, addr, false); err != nil {
		return fmt.Errorf("restart mariadb: the server did not stop: %w", err)
	}
	// The port closes before the process has exited; start-stop-daemon --oknodo would take the
	// exiting process for a running server and start nothing.
	if err := waitExited(ctx, mariadbd); err != nil {
		return fmt.Errorf("restart mariadb: the server did not exit: %w", err)
	}
	out, err := exec.CommandContext(ctx, "start-stop-daemon", "--start", "--oknodo", "--background", "--exec", mariadbd).CombinedOutput()
	if err != nil {
		return fmt.Errorf("restart mariadb: start: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := waitPort(ctx, addr, true); err != nil {
		return fmt.Errorf("restart mariadb: the server did not come back: %w", err)
	}
	return nil
}

// waitExited polls until no process runs the executable exe.
func waitExited(ctx context.Context, exe string) error {
	for {
		// --status exits 3 when no process runs exe.
		err := exec.CommandContext(ctx, "start-stop-daemon", "--status", "--exec", exe).Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 3 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // polling the server's state, not ordering work
		}
	}
}

// waitPort polls addr until it accepts connections (open) or refuses them (!open).
func waitPort(ctx context.Context, addr string, open bool) error {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if c != nil {
			_ = c.Close()
		}
		if (err == nil) == open {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // polling the server's state, not ordering work
		}
	}
}
