// Package etcd runs the fenced protocol on an etcd v3 cluster.
//
// Every decision is one etcd transaction (Txn with If/Then/Else) evaluated by the cluster:
// acquisition compares the generation key's mod revision and the absence of the owner key,
// publication compares the generation, the owner and the published generation, and so on.
// etcd transactions are linearizable and go through Raft, so generations never go backwards,
// also across leader changes; this package uses only the default linearizable reads.
//
// Expiry is judged by etcd: the owner key is put with an etcd lease whose TTL is the fenced
// lease's TTL (rounded UP to whole seconds, which is all etcd offers, and raised by etcd to its
// own minimum, 2 s with the default election timeout). When the etcd lease runs out the cluster
// deletes the owner key, and every later Txn that requires it fails. No client clock decides
// anything. Because etcd exposes no clock of its own, the times this backend reports are the
// local clock's and informational: lease_until is the local time at grant plus the granted TTL
// (an underestimate of when etcd will expire it), published_at is the publisher's local time,
// and State.Now is the reader's local time, adjusted so that State.Held() follows the owner
// key's existence (see Read).
//
// Payloads travel in one Txn, so they are bounded by the cluster's --max-request-bytes (1.5 MiB
// by default) and the client's MaxCallSendMsgSize (2 MiB by default). Options.MaxPayloadBytes
// enforces a limit below that before sending; raise both together.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced/driver"
)

const (
	// DefaultPrefix is Options.Prefix when it is empty.
	DefaultPrefix = "/fenced/"

	// DefaultMaxPayloadBytes is Options.MaxPayloadBytes when it is zero: etcd's default
	// --max-request-bytes (1.5 MiB) less 64 KiB for the keys and the other operations of the
	// publishing Txn.
	DefaultMaxPayloadBytes = 3<<19 - 64<<10

	// acquireAttempts bounds the retries of an acquisition whose Txn found the generation
	// moved and the lease free again (another owner acquired and released in between).
	acquireAttempts = 16

	// cleanupTimeout bounds revoking an etcd lease after the operation that used it ended.
	cleanupTimeout = 5 * time.Second
)

// ErrPayloadTooLarge is returned by Publish and PublishAndRelease, before anything is sent, for
// a payload over Options.MaxPayloadBytes.
var ErrPayloadTooLarge = errors.New("payload exceeds the etcd backend's limit")

// Options tunes a Driver. A nil *Options means the defaults. New copies what it needs, so an
// Options value may be reused or changed afterwards, also concurrently with the driver's use.
type Options struct {
	// Prefix is prepended to every key. Default DefaultPrefix. Several stores can share a
	// cluster under different prefixes.
	Prefix string

	// MaxPayloadBytes is the largest payload this driver sends. Default DefaultMaxPayloadBytes,
	// which fits etcd's default --max-request-bytes; raise it only together with the
	// cluster's --max-request-bytes and the client's MaxCallSendMsgSize.
	MaxPayloadBytes int
}

// Driver is the etcd backend. It is safe for concurrent use by multiple goroutines, as is the
// *clientv3.Client it wraps.
type Driver struct {
	cli        *clientv3.Client
	owned      bool
	prefix     string
	maxPayload int

	// skipRevoke, set only by tests, simulates an etcd lease revocation whose request was
	// lost, leaving a detached etcd lease alive.
	skipRevoke bool
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over a client the caller created and keeps ownership of: Close leaves
// it open.
func New(client *clientv3.Client, opts *Options) *Driver {
	d := &Driver{cli: client, prefix: DefaultPrefix, maxPayload: DefaultMaxPayloadBytes}
	if opts != nil {
		if opts.Prefix != "" {
			d.prefix = opts.Prefix
		}
		if opts.MaxPayloadBytes > 0 {
			d.maxPayload = opts.MaxPayloadBytes
		}
	}
	return d
}

// Open connects to the cluster named by a URL of the form
// etcd://host:port[,host:port...][?prefix=/my/prefix/], over plain gRPC without TLS or
// authentication (create the client yourself and use New for those). The driver owns the
// client and closes it in Close.
func Open(rawURL string) (*Driver, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("open etcd: parse url: %w", err)
	}
	if u.Scheme != "etcd" || u.Host == "" {
		return nil, fmt.Errorf("open etcd: %q is not etcd://host:port[,host:port...]", rawURL)
	}
	var endpoints []string
	for ep := range strings.SplitSeq(u.Host, ",") {
		if ep == "" {
			return nil, fmt.Errorf("open etcd: %q has an empty endpoint", rawURL)
		}
		endpoints = append(endpoints, ep)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(), // failures reach the caller as errors
	})
	if err != nil {
		return nil, fmt.Errorf("open etcd %s: %w", u.Host, err)
	}
	d := New(cli, &Options{Prefix: u.Query().Get("prefix")})
	d.owned = true
	return d, nil
}

// Client returns the underlying client.
func (d *Driver) Client() *clientv3.Client { return d.cli }

// Close closes the client if Open created it.
func (d *Driver) Close() error {
	if d.owned {
		return d.cli.Close()
	}
	return nil
}

// Migrate does nothing: etcd has no schema.
func (d *Driver) Migrate(context.Context) error { return nil }

// Provision creates the generation and publication keys at generation 0 if the generation key
// does not exist; the Txn never touches an existing resource.
func (d *Driver) Provision(ctx context.Context, resource string) error {
	k := d.keys(resource)
	_, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k.gen), "=", 0)).
		Then(clientv3.OpPut(k.gen, encodeGen(0)), clientv3.OpPut(k.pub, encodeGen(0))).
		Commit()
	if err != nil {
		return fmt.Errorf("provision txn: %w", err)
	}
	return nil
}

// leaseSnapshot is the lease part of a resource as one Txn read it.
type leaseSnapshot struct {
	gen   *kvPair // nil: not provisioned
	owner *kvPair // nil: no unexpired lease
	until *kvPair
}

func readLeaseOps(k keys) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(k.gen), clientv3.OpGet(k.owner), clientv3.OpGet(k.until)}
}

func leaseSnapshotAt(resp *clientv3.TxnResponse, first int) leaseSnapshot {
	return leaseSnapshot{gen: kv(resp, first), owner: kv(resp, first+1), until: kv(resp, first+2)}
}

// busy builds the refusal of an acquisition from a snapshot that shows the owner key.
func (s leaseSnapshot) busy() error {
	gen, err := decodeGen(s.gen.value)
	if err != nil {
		return err
	}
	b := &driver.BusyError{Generation: gen}
	if s.until != nil {
		if b.LeaseUntil, err = decodeTime(s.until.value); err != nil {
			return err
		}
	}
	return b
}

// Acquire reads the generation and owner keys (one linearizable read), grants an etcd lease
// and then runs the deciding Txn:
//
//	If   gen.ModRevision == the revision read  (nobody acquired in between)
//	     owner.CreateRevision == 0              (no unexpired lease: etcd deleted the key
//	                                             when the previous etcd lease ran out)
//	Then gen = read+1, owner = id WITH the etcd lease, holder = id, until
//	Else read gen, owner and until again
//
// Two acquisitions that read the same revision cannot both win: the first Txn changes the
// generation key's mod revision, so the second one's If fails inside etcd. A lost race
// answers busy from the Else branch's read of the owner key. An owner key seen in the first
// read already answers busy: that linearizable read is a moment at which the lease was held.
func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	k := d.keys(resource)
	read, err := d.cli.Txn(ctx).Then(readLeaseOps(k)...).Commit()
	if err != nil {
		return driver.Grant{}, fmt.Errorf("read lease: %w", err)
	}
	snap := leaseSnapshotAt(read, 0)
	switch {
	case snap.gen == nil:
		return driver.Grant{}, driver.ErrNotFound
	case snap.owner != nil:
		return driver.Grant{}, snap.busy()
	}

	sent := time.Now()
	lease, err := d.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return driver.Grant{}, fmt.Errorf("grant etcd lease: %w", err)
	}
	won := false
	defer func() {
		// A refused or failed acquisition leaves nothing attached to the etcd lease; revoking
		// it is cleanup. After a Txn whose reply was lost it also ends an acquisition that may
		// have succeeded, which is safe: its caller was told it failed.
		if !won {
			d.revoke(ctx, lease.ID)
		}
	}()
	until := sent.Add(time.Duration(lease.TTL) * time.Second)
	for range acquireAttempts {
		gen, err := decodeGen(snap.gen.value)
		if err != nil {
			return driver.Grant{}, err
		}
		resp, err := d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(k.gen), "=", snap.gen.modRevision),
				clientv3.Compare(clientv3.CreateRevision(k.owner), "=", 0)).
			Then(clientv3.OpPut(k.gen, encodeGen(gen+1)),
				clientv3.OpPut(k.owner, owner, clientv3.WithLease(lease.ID)),
				clientv3.OpPut(k.holder, owner),
				clientv3.OpPut(k.until, encodeTime(until))).
			Else(readLeaseOps(k)...).
			Commit()
		if err != nil {
			return driver.Grant{}, fmt.Errorf("acquire txn: %w", err)
		}
		if resp.Succeeded {
			won = true
			return driver.Grant{Generation: gen + 1, LeaseUntil: until.UTC()}, nil
		}
		snap = leaseSnapshotAt(resp, 0)
		switch {
		case snap.gen == nil:
			return driver.Grant{}, driver.ErrNotFound
		case snap.owner != nil:
			return driver.Grant{}, snap.busy()
		}
		// Another owner acquired and already released since our read: try again from the
		// generation etcd just returned.
	}
	return driver.Grant{}, fmt.Errorf("acquire: lost %d races in a row to acquisitions that released at once", acquireAttempts)
}

// Renew grants a new etcd lease with the new TTL and moves the owner key onto it, in a Txn
// that requires the generation and the owner key to be this acquisition's:
//
//	If   gen == g, owner == id     (the owner key exists only while the etcd lease is alive,
//	                                so an expired lease is never revived)
//	Then read owner (its old etcd lease), owner = id WITH the new etcd lease, until
//
// and then revokes the old etcd lease, which no key uses any more.
//
// Why not KeepAliveOnce on the existing etcd lease: it cannot change the TTL, and it is not
// conditional. Even so, a keepalive that arrives late cannot revive anything: the owner key of
// generation g is attached only to etcd leases granted for generation g; once that key has
// been deleted (by expiry, revocation or release) or the generation has moved on, extending
// such an etcd lease keeps alive a lease that no key uses. TestLateKeepAliveRevivesNothing
// checks exactly that.
func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	k := d.keys(l.Resource)
	sent := time.Now()
	lease, err := d.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("grant etcd lease: %w", err)
	}
	until := sent.Add(time.Duration(lease.TTL) * time.Second)
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k.gen), "=", encodeGen(l.Generation)),
			clientv3.Compare(clientv3.Value(k.owner), "=", l.Owner)).
		Then(clientv3.OpGet(k.owner),
			clientv3.OpPut(k.owner, l.Owner, clientv3.WithLease(lease.ID)),
			clientv3.OpPut(k.until, encodeTime(until))).
		Commit()
	if err != nil {
		// The outcome is unknown: the owner key may already sit on the new etcd lease, so
		// it is left alone (revoking it would end a lease its holder may still be using);
		// whichever of the two etcd leases no key uses expires on its own.
		return time.Time{}, false, fmt.Errorf("renew txn: %w", err)
	}
	if !resp.Succeeded {
		d.revoke(ctx, lease.ID)
		return time.Time{}, false, nil
	}
	if old := kv(resp, 0); old != nil && old.lease != 0 {
		d.revoke(ctx, clientv3.LeaseID(old.lease))
	}
	return until.UTC(), true, nil
}

// publishTxn is the Txn of Publish and PublishAndRelease: etcd stores the payload only where
// the generation is g, the owner key holds this owner (so its etcd lease has not expired) and
// the published generation is below g (fixed-width values compared bytewise; see encodeGen).
func (d *Driver) publishTxn(ctx context.Context, l driver.LeaseRef, payload []byte, release bool) (*clientv3.TxnResponse, error) {
	if len(payload) > d.maxPayload {
		return nil, fmt.Errorf("publish %d bytes: %w (%d bytes; etcd's default --max-request-bytes is 1.5 MiB)",
			len(payload), ErrPayloadTooLarge, d.maxPayload)
	}
	k := d.keys(l.Resource)
	then := []clientv3.Op{
		clientv3.OpPut(k.pub, encodePub(l.Generation, time.Now(), len(payload))),
		clientv3.OpPut(k.payload, string(payload)),
	}
	if release {
		then = append(then, releaseOps(k)...)
	}
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k.gen), "=", encodeGen(l.Generation)),
			clientv3.Compare(clientv3.Value(k.owner), "=", l.Owner),
			clientv3.Compare(clientv3.Value(k.pub), "<", encodeGen(l.Generation))).
		Then(then...).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("publish txn: %w", err)
	}
	return resp, nil
}

// releaseOps free the lease: the first reads the owner key for its etcd lease, to be revoked
// after the Txn.
func releaseOps(k keys) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(k.owner), clientv3.OpDelete(k.owner),
		clientv3.OpDelete(k.holder), clientv3.OpDelete(k.until)}
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload := pub.Payload // TODO(issue 4): epoch, operation id and source version
	resp, err := d.publishTxn(ctx, l, payload, false)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload := pub.Payload // TODO(issue 4): epoch, operation id and source version
	resp, err := d.publishTxn(ctx, l, payload, true)
	if err != nil {
		return false, err
	}
	if resp.Succeeded {
		d.revokeReleased(ctx, resp, 2)
	}
	return resp.Succeeded, nil
}

// Release frees the lease where the generation and the holder still match, expired or not,
// like the SQL backends: If gen == g, holder == id Then delete owner, holder, until. The etcd
// lease is revoked afterwards; no key uses it any more.
func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	k := d.keys(l.Resource)
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k.gen), "=", encodeGen(l.Generation)),
			clientv3.Compare(clientv3.Value(k.holder), "=", l.Owner)).
		Then(releaseOps(k)...).
		Commit()
	if err != nil {
		return false, fmt.Errorf("release txn: %w", err)
	}
	if resp.Succeeded {
		d.revokeReleased(ctx, resp, 0)
	}
	return resp.Succeeded, nil
}

// revokeReleased revokes the etcd lease of the owner key that the i-th op (a Get) read just
// before the same Txn deleted it.
func (d *Driver) revokeReleased(ctx context.Context, resp *clientv3.TxnResponse, i int) {
	if owner := kv(resp, i); owner != nil && owner.lease != 0 {
		d.revoke(ctx, clientv3.LeaseID(owner.lease))
	}
}

// revoke ends an etcd lease that no key needs any more. It is cleanup: a failure leaves an
// etcd lease without keys that expires on its own, so it is not reported.
func (d *Driver) revoke(ctx context.Context, id clientv3.LeaseID) {
	if d.skipRevoke {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = d.cli.Revoke(ctx, id)
}

// Read returns the resource as one Txn (one revision) saw it. Owner is the holder key, which
// outlives expiry; the lease counts as held exactly while the owner key exists, as etcd
// judges. etcd has no clock to read, so Now is the local clock, and where the informational
// LeaseUntil disagrees with etcd's judgement (the key outlived the local estimate, or the etcd
// lease was revoked early) Now is moved just past or just before LeaseUntil so that Held()
// tells what etcd decided.
func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	k := d.keys(resource)
	resp, err := d.cli.Txn(ctx).
		Then(append(readLeaseOps(k), clientv3.OpGet(k.holder), clientv3.OpGet(k.pub))...).
		Commit()
	if err != nil {
		return driver.State{}, fmt.Errorf("read txn: %w", err)
	}
	now := time.Now().UTC()
	snap := leaseSnapshotAt(resp, 0)
	if snap.gen == nil {
		return driver.State{}, driver.ErrNotFound
	}
	st := driver.State{Resource: resource, Now: now}
	if st.Generation, err = decodeGen(snap.gen.value); err != nil {
		return driver.State{}, err
	}
	if holder := kv(resp, 3); holder != nil {
		st.Owner = string(holder.value)
	}
	if snap.until != nil {
		if st.LeaseUntil, err = decodeTime(snap.until.value); err != nil {
			return driver.State{}, err
		}
	}
	switch held := snap.owner != nil && st.Owner != ""; {
	case held && !st.LeaseUntil.After(now):
		st.Now = st.LeaseUntil.Add(-time.Nanosecond)
	case !held && st.LeaseUntil.After(now):
		st.Now = st.LeaseUntil
	}
	if pub := kv(resp, 4); pub != nil {
		p, err := decodePub(pub.value)
		if err != nil {
			return driver.State{}, err
		}
		st.PublishedGeneration, st.PublishedAt, st.PayloadSize = p.generation, p.at, p.size
	}
	return st, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	k := d.keys(resource)
	resp, err := d.cli.Txn(ctx).
		Then(clientv3.OpGet(k.gen, clientv3.WithKeysOnly()), clientv3.OpGet(k.pub), clientv3.OpGet(k.payload)).
		Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("read payload txn: %w", err)
	}
	if kv(resp, 0) == nil {
		return nil, 0, driver.ErrNotFound
	}
	var p publication
	if pub := kv(resp, 1); pub != nil {
		if p, err = decodePub(pub.value); err != nil {
			return nil, 0, err
		}
	}
	if p.generation == 0 {
		return nil, 0, nil
	}
	payload := []byte{}
	if v := kv(resp, 2); v != nil && v.value != nil {
		payload = v.value
	}
	return payload, p.generation, nil
}

// MaxPayloadBytes reports the driver's payload limit, so that a fenced.Store refuses a larger
// payload as invalid input before anything is sent.
func (d *Driver) MaxPayloadBytes() int { return d.maxPayload }

// TODO(issue 4): the recovery features below are being implemented for this backend; until then
// they fail loudly and the conformance suite's tests for them fail.
var errIssue4Pending = errors.New("etcd backend: epochs, operation ids and source versions are not implemented yet")

func (d *Driver) ResolveOperation(context.Context, string) (driver.Operation, error) {
	return driver.Operation{}, errIssue4Pending
}

func (d *Driver) ReadOperation(context.Context, string) (driver.Operation, error) {
	return driver.Operation{}, errIssue4Pending
}

func (d *Driver) BumpEpoch(context.Context) (int64, error) { return 0, errIssue4Pending }

func (d *Driver) PruneOperations(context.Context, time.Duration) (int64, error) {
	return 0, errIssue4Pending
}
