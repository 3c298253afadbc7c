package cli

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/fenced-dev/fenced/backend/etcd"
)

// etcdRole arranges the role of the etcd member the run's clients talk to (the URL's first
// endpoint) before the partition fault cuts it off from its peers: the leader when leader is
// set, else a follower, moving leadership with MoveLeader (sent to the current leader) when
// the member has the other role. It returns a description of the member's role for the
// timeline. --partition-dev must then be the link between that member and its peers, so that
// clients keep talking to a member that cannot reach a quorum.
func etcdRole(ctx context.Context, d *etcd.Driver, rawURL string, leader bool) (string, error) {
	cli := d.Client()
	eps := cli.Endpoints()
	if len(eps) == 0 {
		return "", fmt.Errorf("the client has no endpoint")
	}
	// Right after a partition healed (or a restart) the member may know no leader yet (0):
	// ask again until it does.
	st, err := cli.Status(ctx, eps[0])
	for err == nil && st.Leader == 0 {
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s knows no leader: %w", eps[0], ctx.Err())
		case <-time.After(100 * time.Millisecond): // polling the member's state, not ordering work
		}
		st, err = cli.Status(ctx, eps[0])
	}
	if err != nil {
		return "", fmt.Errorf("status of %s: %w", eps[0], err)
	}
	members, err := cli.MemberList(ctx)
	if err != nil {
		return "", fmt.Errorf("member list: %w", err)
	}
	self, current := st.Header.MemberId, st.Leader
	name := func(id uint64) string {
		for _, m := range members.Members {
			if m.ID == id && m.Name != "" {
				return m.Name
			}
		}
		return strconv.FormatUint(id, 16)
	}
	// The role described is the one etcd reports afterwards, not the one asked for.
	role := func(moved string) (string, error) {
		st, err := cli.Status(ctx, eps[0])
		if err != nil {
			return "", fmt.Errorf("status of %s: %w", eps[0], err)
		}
		if st.Leader == self {
			return "member " + name(self) + " (the leader" + moved + ")", nil
		}
		return "member " + name(self) + " (a follower" + moved + ")", nil
	}
	if len(members.Members) < 2 {
		return "member " + name(self) + " (the only member: no peers to lose)", nil
	}
	if (self == current) == leader {
		return role("")
	}
	target := self
	if !leader {
		for _, m := range members.Members {
			if m.ID != self {
				target = m.ID
				break
			}
		}
	}
	var leaderURL string
	for _, m := range members.Members {
		if m.ID == current && len(m.ClientURLs) > 0 {
			leaderURL = m.ClientURLs[0]
		}
	}
	if leaderURL == "" {
		return "", fmt.Errorf("the leader %s advertises no client URL", name(current))
	}
	// The leader's own URL: the run's, with its host, so that TLS and credentials carry over.
	lu, err := url.Parse(leaderURL)
	if err != nil {
		return "", fmt.Errorf("the leader's client URL %q: %w", leaderURL, err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	u.Host = lu.Host
	ld, err := etcd.Open(u.String())
	if err != nil {
		return "", err
	}
	defer ld.Close()
	if _, err := ld.Client().MoveLeader(ctx, target); err != nil {
		return "", fmt.Errorf("move leadership from %s to %s: %w", name(current), name(target), err)
	}
	return role(fmt.Sprintf("; leadership moved from %s to %s", name(current), name(target)))
}
