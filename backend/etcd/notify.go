package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/driver"
)

var _ driver.ReleaseNotifier = (*Driver)(nil)

// NotifyReleased subscribes to the freeing of resource's lease (see driver.ReleaseNotifier)
// with two etcd watches, multiplexed on the client's one watch stream: deletions of the
// resource's owner key (a release, a publish-and-release, and also the end of the lease's TTL,
// since etcd deletes the key itself then: expiry needs no clock here) and puts of the store's
// epoch key (a bump frees every lease). Both watch from the revision just after a read made
// before NotifyReleased returns, so an event between that read and the watches' registration
// on the server is still delivered. A watch that ends (the client closed, the revision
// compacted, the cluster lost its leader) signals once and ends the subscription: the waiter
// then checks and falls back to polling.
func (d *Driver) NotifyReleased(ctx context.Context, resource string) (<-chan struct{}, func(), error) {
	k := d.keys(resource)
	resp, err := d.cli.Get(ctx, d.epochKey(), clientv3.WithCountOnly())
	if err != nil {
		return nil, nil, fmt.Errorf("watch for freed leases: %w", err)
	}
	from := resp.Header.Revision + 1
	// WithRequireLeader: a member cut off from the quorum ends the watch instead of staying
	// silent while the others go on.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.WithoutCancel(ctx)))
	owner := d.cli.Watch(wctx, k.owner, clientv3.WithRev(from), clientv3.WithFilterPut())
	epoch := d.cli.Watch(wctx, d.epochKey(), clientv3.WithRev(from), clientv3.WithFilterDelete())
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var wr clientv3.WatchResponse
			var ok bool
			select {
			case wr, ok = <-owner:
			case wr, ok = <-epoch:
			}
			if !ok || wr.Canceled || wr.Err() != nil {
				signal(ch) // lost the way of listening: the waiter checks, then polls
				cancel()
				for range owner { // drain, so that clientv3 can close both
				}
				for range epoch {
				}
				return
			}
			if len(wr.Events) > 0 {
				signal(ch)
			}
		}
	}()
	stop := func() {
		cancel()
		<-done
	}
	return ch, stop, nil
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
