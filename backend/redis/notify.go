package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/driver"
)

var _ driver.ReleaseNotifier = (*Driver)(nil)

// releasedChannel is the pub/sub channel on which the release, publish-and-release and
// bump-epoch scripts announce, from inside the script, a lease they freed: the message is the
// resource's hash key, or the epoch key for a bump (every lease freed). Pub/sub is not
// persisted: a message sent while the listening connection is down is lost, which is why
// losing the connection wakes every subscriber.
func (d *Driver) releasedChannel() string { return d.prefix + "released" }

// listenPing bounds how long the listening connection stays silent before it is checked with a
// PING, so that a connection that died without a word is noticed.
const listenPing = 30 * time.Second

// listener holds one pub/sub connection of the driver's own, started by the first subscription
// and stopped by Close, and hands each message to the subscribers of its resource.
type listener struct {
	subs   driver.Subscribers // by the resource's hash key
	mu     sync.Mutex
	ps     *goredis.PubSub
	cancel context.CancelFunc
	done   chan struct{}
}

// NotifyReleased subscribes to the freeing of resource's lease (see driver.ReleaseNotifier).
// It returns once the server confirmed the channel's subscription, so a release after it
// returns is heard.
func (d *Driver) NotifyReleased(ctx context.Context, resource string) (<-chan struct{}, func(), error) {
	l := &d.listen
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ps == nil {
		ps := d.client.Subscribe(ctx, d.releasedChannel())
		// The first reply is the subscription's confirmation (or the connection's failure).
		if _, err := ps.Receive(ctx); err != nil {
			_ = ps.Close()
			return nil, nil, fmt.Errorf("subscribe to freed leases: %w", err)
		}
		lctx, cancel := context.WithCancel(context.Background())
		l.ps, l.cancel, l.done = ps, cancel, make(chan struct{})
		go d.listenLoop(lctx, ps, l.done)
	}
	ch, stop := l.subs.Add(d.Key(resource))
	return ch, stop, nil
}

func (d *Driver) listenLoop(ctx context.Context, ps *goredis.PubSub, done chan struct{}) {
	defer close(done)
	l := &d.listen
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		msg, err := ps.ReceiveTimeout(ctx, listenPing)
		var ne net.Error
		switch {
		case ctx.Err() != nil:
			return
		case errors.As(err, &ne) && ne.Timeout():
			err = ps.Ping(ctx) // an error here makes go-redis reconnect on the next receive
		}
		if err != nil {
			// The connection failed: messages may have been lost. Wake everyone so that they
			// check; go-redis dials again and subscribes again on the next receive.
			l.subs.SignalAll()
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		switch m := msg.(type) {
		case *goredis.Subscription:
			// Subscribed again after a reconnection: a release in between was not heard.
			l.subs.SignalAll()
		case *goredis.Message:
			if m.Payload == d.epochKey() {
				l.subs.SignalAll()
				continue
			}
			l.subs.Signal(m.Payload)
		}
	}
}

// stopListening ends the loop, closes its connection and waits for it.
func (d *Driver) stopListening() {
	l := &d.listen
	l.mu.Lock()
	ps, cancel, done := l.ps, l.cancel, l.done
	l.ps = nil
	l.mu.Unlock()
	if ps != nil {
		cancel()
		_ = ps.Close()
		<-done
	}
}
