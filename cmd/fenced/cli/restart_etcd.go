package cli

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

// restartFault is the restart fault. On etcd the restart command crashes the member of the
// URL's first endpoint (kill -9) and starts it from its data directory; before it, that member
// is made the leader (odd restarts) or a follower (even ones) with MoveLeader, as the
// partition fault does, so that the leader's crash is exercised, and after it the fault waits
// until the member has rejoined: it knows a leader and serves a linearizable read (which
// needs the leader's commit index applied). The timeline says which member, in which role,
// and the raft term before the crash and after the rejoining.
func (t *tortureRun) restartFault(ctx context.Context) {
	what := ""
	d, isEtcd := t.drv.(*etcd.Driver)
	if isEtcd {
		t.restarts++
		what = "etcd " + t.arrangeRole(ctx, d, t.restarts)
		// The term before the crash: a crashed leader's successor is elected in a later one.
		if eps := d.Client().Endpoints(); len(eps) > 0 {
			stCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if st, err := d.Client().Status(stCtx, eps[0]); err == nil {
				what += fmt.Sprintf(" at raft term %d", st.RaftTerm)
			}
			cancel()
		}
		what += " killed by the restart command and started again"
	}
	begin := torture.Now()
	detail := "server restarted"
	if what != "" {
		detail = what
	}
	// The server's start before the restart, where the engine names it (serverStart): a
	// restart that reported success must have changed it.
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	before, confirmable, serr := serverStart(startCtx, t.drv)
	cancel()
	err := t.restart(ctx)
	cmdErr := err
	unconfirmed := ""
	switch {
	case err != nil:
	case !confirmable && t.o.restartCmd != "": // torture's own MariaDB restart saw the port close and open
		unconfirmed = " (not confirmed: the engine names no start to compare)"
	case !confirmable:
	case serr != nil:
		unconfirmed = " (not confirmed: the server's start could not be read before it: " + serr.Error() + ")"
	default:
		err = restartLanded(ctx, t.drv, before)
	}
	switch {
	case err != nil && what != "":
		detail = what + ": " + err.Error()
	case err != nil:
		detail = err.Error()
	case isEtcd:
		rejoinCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rejoined, rerr := etcdRejoined(rejoinCtx, d, t.url)
		cancel()
		if rerr != nil {
			detail += "; not rejoined: " + rerr.Error()
		} else {
			detail += "; " + rejoined
		}
	}
	detail += unconfirmed
	// A restarted Redis has a new run id: its scripts bump the epoch at the first
	// lease-carrying request, which frees every lease held across the restart. The
	// checker's model must know it, or a holder's refused release is a violation to it. A
	// restart whose command succeeded but which could not be confirmed may have happened, so
	// its bump stays possible; only one seen not to happen has none.
	_, selfBump := t.drv.(*redis.Driver)
	selfBump = selfBump && cmdErr == nil && !errors.Is(err, errNotRestarted)
	// A restart that failed is recorded with its error, so that the report counts it apart.
	rec := torture.Record{Kind: torture.KindEvent, Event: torture.FaultRestart, Time: begin, EndTime: torture.Now(),
		Detail: detail, SelfBump: selfBump}
	if err != nil {
		rec.Err = err.Error()
	}
	_ = t.nem.Write(rec)
}

// arrangeRole makes the member of the run's first endpoint the leader before the nth fault
// that alternates it (n odd) or a follower (n even), and describes the role etcd then reports.
func (t *tortureRun) arrangeRole(ctx context.Context, d *etcd.Driver, n int) string {
	roleCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	role, err := etcdRole(roleCtx, d, t.url, n%2 == 1)
	if err != nil {
		return "the clients' member (its role not arranged: " + err.Error() + ")"
	}
	return role
}

// etcdRejoined waits until the member of the client's first endpoint, restarted, has rejoined
// its cluster: its Status names a leader and a client of that member alone completes a
// linearizable read (ReadIndex from the leader, then applied up to it). It describes the
// cluster's leadership then.
func etcdRejoined(ctx context.Context, d *etcd.Driver, rawURL string) (string, error) {
	eps := d.Client().Endpoints()
	if len(eps) == 0 {
		return "", errors.New("the client has no endpoint")
	}
	md, err := memberDriver(rawURL, eps[0])
	if err != nil {
		return "", err
	}
	defer md.Close()
	cli := md.Client()
	for {
		st, err := cli.Status(ctx, eps[0])
		if err == nil && st.Leader != 0 && len(st.Errors) == 0 {
			if _, err = cli.Get(ctx, "fenced-torture-rejoin-probe"); err == nil {
				role := "a follower"
				if st.Leader == st.Header.MemberId {
					role = "the leader"
				}
				return fmt.Sprintf("rejoined as %s (raft term %d)", role, st.RaftTerm), nil
			}
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New("no leader known")
			}
			return "", fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond): // polling the member's state, not ordering work
		}
	}
}

// memberDriver opens the run's URL on one member only, endpoint ep (host:port, with or
// without a scheme), so that TLS and credentials carry over.
func memberDriver(rawURL, ep string) (*etcd.Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if _, host, ok := strings.Cut(ep, "://"); ok {
		ep = host
	}
	u.Host = ep
	return etcd.Open(u.String())
}
