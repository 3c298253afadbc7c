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
// own minimum, 2 s with the default election timeout); an etcd lease granted ahead of the
// acquisition (ahead.go) is used only in the window of its life where etcd keeps it at least
// the TTL from the acquisition's start and at most Options.AheadBound (1 s) more, and one
// that a confirmed release freed is reused by a later acquisition after a keepalive that
// starts its life again (reuse.go). Both pools judge a lease's remaining life on the trust
// window's clock (internal/trustclock), which counts a suspend of the machine, as etcd's
// server does while the client sleeps. When the
// etcd lease runs out the cluster deletes the owner key, and every later Txn that requires it fails. No client clock decides
// anything. Because etcd exposes no clock of its own, the times this backend reports are the
// local clock's and informational: lease_until is the local time at grant plus the granted TTL
// (an underestimate of when etcd will expire it), published_at is the publisher's local time,
// and State.Now is the reader's local time, adjusted so that State.Held() follows the owner
// key's existence (see Read).
//
// Payloads travel in one Txn, so they are bounded by the cluster's --max-request-bytes (1.5 MiB
// by default) and the client's MaxCallSendMsgSize (2 MiB by default). Options.MaxPayloadBytes
// enforces a limit below that before sending; raise both together.
//
// # Epochs, operation ids and source versions
//
// The store's epoch is one key (<prefix>epoch), created by Migrate at the clock in microseconds
// since 1970 and set by BumpEpoch to max(epoch + 1, the clock), so that a store lost entirely (a
// new cluster, the prefix deleted) starts above every epoch it had. etcd has no clock of its
// own, so the clock is that of the client that creates or bumps the epoch: this assumes that
// the clocks of the machines running fenced against one store are synchronised (NTP) to well
// within the time a loss and a re-creation take, and never go back across the loss. A client
// whose clock is behind the epoch's by more than that would create, after a total loss, an
// epoch at or below the old one, and old tokens would be issued again. The gen key holds the
// token (epoch, generation), and every lease-carrying Txn compares both the token and the
// epoch key with the lease's, so BumpEpoch, a compare-and-swap of that one key, fences every
// earlier lease at once; Acquire treats a lease of an earlier epoch as free, and Read reports
// it without an owner. A publication records its operation id under <prefix>ops/<id>/op in
// the same Txn, which requires that key not to exist; ResolveOperation creates it as aborted
// when absent. Operation records carry the recording client's clock (etcd has none), and
// PruneOperations judges their age by the pruning client's clock. keys.go lists every key.
//
// # Layout version 3
//
// Version 3 keeps the holder and the informational expiry inside the gen key's value, after the
// token (keys.go), where version 2 had two more keys: an acquire+release pair writes gen and
// owner and then deletes owner and puts gen back, 3 puts and 1 delete where version 2 did 4 and
// 3 (TestPairReadsNothingThroughRaft counts them). Migrate folds a version 2 store in place,
// one Txn per resource pinned on the mod revisions of the keys it folds (migrate.go); a lease
// held across it stays held by its owner, on its etcd lease. Stop every client running an older
// fenced first: a version 2 driver refuses a folded gen key (its Txns compare gen with the bare
// token, and it cannot decode the value), so by a reading of its code it fails closed, but it
// does not stop. No test runs a version 2 driver against a folded store. The other way round,
// this driver opened on a version 2 store that nobody migrated (fenced.Config.SkipMigrate)
// refuses every operation before sending it, not applied, with ErrNotMigrated
// (checkLayout, TestUnmigratedVersion2FailsClosed).
//
// # Unknown outcomes
//
// An error is reported as not applied (driver.ErrNotApplied) only when the Txn never left the
// client or etcd rejected it as a whole; everything else (a broken connection, a timeout, a
// leader change during the request) leaves the outcome unknown. Telling a request that never
// left the client from a lost reply needs the gRPC stats handler in DialOptions, which Open
// installs and a client passed to New should have; classify.go explains how, and why
// clientv3 never resends a Txn whose reply was lost.
//
// # Durability and restores
//
// etcd fsyncs its write-ahead log before acknowledging, unless a member runs with
// --unsafe-no-fsync, a server flag no client can see; the driver therefore does not implement
// driver.DurabilityChecker. A member restored from a snapshot (etcdutl snapshot restore)
// starts a new cluster whose history may end before acknowledged generations: bump the epoch
// (fenced epoch bump) after a restore. The driver does not detect restores itself
// (driver.ErrIncarnationChanged); a cluster recreated empty needs nothing (see Epochs).
package etcd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

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

	// AheadBound is how much longer than its TTL, counted from the acquisition, the etcd lease
	// of an acquisition may live when it was granted ahead of the acquisition (ahead.go): a
	// holder that vanishes leaves the resource to others at most this much after its TTL, plus
	// the delay with which etcd revokes expired leases (its lessor looks every 500 ms). A
	// lease granted ahead serves a window of this length per second of its life, so a smaller
	// bound keeps more leases alive for the same acquisitions, and costs throughput (measured
	// in docs/BENCHMARKS.md). Default DefaultAheadBound, with which a lease serves from its
	// grant for one second, as before the bound existed; negative: never grant ahead (every
	// acquisition grants its own lease, rounded up to whole seconds: see above).
	AheadBound time.Duration

	// DisableLeaseReuse revokes the etcd lease of each acquisition after its release instead
	// of keeping it for a later acquisition (reuse.go): every acquisition that finds no lease
	// granted ahead in its window then grants one, a Raft write, where a reused lease costs
	// one keepalive answered by the leader. For comparison (bench/peers) and for clusters
	// that must not hold leases for released resources (at most the ones in use at once, per
	// TTL, each for at most its TTL after the last use).
	DisableLeaseReuse bool
}

// DefaultAheadBound is Options.AheadBound's default.
const DefaultAheadBound = time.Second

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
	noReuse    bool        // Options.DisableLeaseReuse
	layoutOK   atomic.Bool // the store's schema key holds this driver's layout (checkLayout)
	// exactOnly, set only by tests, is the mutation that never sends a lease-carrying Txn again
	// with holderIs's compares after its exact compare of gen was refused (holderTxn).
	exactOnly bool

	ahead ahead // leases granted ahead, cached snapshots, background revocations (ahead.go)
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver over a client the caller created and keeps ownership of: Close leaves
// it open.
func New(client *clientv3.Client, opts *Options) *Driver {
	d := &Driver{cli: client, prefix: DefaultPrefix, maxPayload: DefaultMaxPayloadBytes}
	d.ahead.bound = DefaultAheadBound
	if opts != nil {
		if opts.AheadBound != 0 {
			d.ahead.bound = opts.AheadBound
		}
		if opts.Prefix != "" {
			d.prefix = opts.Prefix
		}
		if opts.MaxPayloadBytes > 0 {
			d.maxPayload = opts.MaxPayloadBytes
		}
		d.noReuse = opts.DisableLeaseReuse
	}
	return d
}

// Open connects to the cluster named by a URL:
//
//	etcd://[user:password@]host:port[,host:port...][?prefix=/my/prefix/]
//	etcds://[user:password@]host:port[,...]?[ca=FILE][&cert=FILE&key=FILE][&server_name=NAME][&prefix=...]
//
// etcd:// is plain gRPC; etcds:// is TLS, verifying the servers against ca (default: the
// system's roots) and presenting the client certificate cert/key when given. user and password
// log in to etcd's authentication; a wrong one is an error from Open. A TLS failure (an
// unknown CA, a refused client certificate) is an error from Open, found at once by one
// handshake with each endpoint before the client's dial (checkTLS), and never falls back to
// plain text. Errors never repeat the URL, which may hold a password. The
// driver owns the client and closes it in Close. A call that finds no endpoint reachable fails
// at once, not applied, naming the endpoints and the cause, instead of waiting for one until its
// context ends (failFast in classify.go).
func Open(rawURL string) (*Driver, error) {
	c, err := parseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("open etcd: %w", err)
	}
	if c.tls != nil {
		if err := checkTLS(c); err != nil {
			return nil, err
		}
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(), // failures reach the caller as errors
		DialOptions: append(DialOptions(), grpc.WithChainUnaryInterceptor(failFast)),
		TLS:         c.tls,
		Username:    c.username,
		Password:    c.password,
	})
	if err != nil {
		err = diagnose(c, err)
		if errors.As(err, new(*connError)) {
			return nil, err // names the endpoints already
		}
		return nil, fmt.Errorf("open etcd %s: %w", strings.Join(c.endpoints, ","), err)
	}
	d := New(cli, &Options{Prefix: c.prefix})
	d.owned = true
	return d, nil
}

// Client returns the underlying client.
func (d *Driver) Client() *clientv3.Client { return d.cli }

// Close closes the client if Open created it.
func (d *Driver) Close() error {
	d.closeAhead()
	if d.owned {
		return d.cli.Close()
	}
	return nil
}

// schemaVersion is the key layout this driver reads and writes (keys.go). Version 2 added the
// epoch, the token in the gen key, source versions and operation records; version 3 folded the
// holder and until keys into gen (Migrate converts a version 2 store); a store written by
// version 1 (before epochs) is not converted.
const schemaVersion = 3

// Migrate creates the epoch key at this client's clock in microseconds and records the layout
// version where they are absent, each in a Txn that never changes an existing key, folds a
// version 2 store into version 3 (fold, migrate.go), and refuses a store that a newer layout
// wrote.
func (d *Driver) Migrate(ctx context.Context) error {
	if _, err := d.txn(ctx, "create epoch",
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(d.epochKey()), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(d.epochKey(), encodeGen(epochClock()))}, nil); err != nil {
		return err
	}
	resp, err := d.txn(ctx, "record schema version",
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(d.schemaKey()), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(d.schemaKey(), strconv.Itoa(schemaVersion))},
		[]clientv3.Op{clientv3.OpGet(d.schemaKey())})
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		v, err := strconv.Atoi(string(kv(resp, 0).value))
		if err != nil || v > schemaVersion {
			return fmt.Errorf("check schema: %s holds %q; this driver knows version %d", d.schemaKey(), kv(resp, 0).value, schemaVersion)
		}
		if v == 2 {
			if err := d.fold(ctx); err != nil {
				return err
			}
		}
	}
	d.layoutOK.Store(true)
	return nil
}

// Provision creates the gen, pub and source keys at generation 0 if the gen key does not
// exist; the Txn never touches an existing resource.
func (d *Driver) Provision(ctx context.Context, resource string) error {
	if err := d.checkLayout(ctx); err != nil {
		return err
	}
	k := d.keys(resource)
	_, err := d.txn(ctx, "provision",
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k.gen), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(k.gen, encodeToken(0, 0)), clientv3.OpPut(k.pub, encodeGen(0)),
			clientv3.OpPut(k.source, encodeGen(0))}, nil)
	return err
}

// leaseSnapshot is the lease part of a resource, and the store's epoch, as one Txn read them.
type leaseSnapshot struct {
	gen   *kvPair // nil: not provisioned
	owner *kvPair // nil: no unexpired lease
	epoch *kvPair // the store's epoch; nil: not migrated
}

func (d *Driver) readLeaseOps(k keys) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(k.gen), clientv3.OpGet(k.owner), clientv3.OpGet(d.epochKey())}
}

func leaseSnapshotAt(resp *clientv3.TxnResponse, first int) leaseSnapshot {
	return leaseSnapshot{gen: kv(resp, first), owner: kv(resp, first+1), epoch: kv(resp, first+2)}
}

// decode returns the store's epoch and the row's gen value. A missing epoch key is an error: no
// operation guesses an epoch.
func (s leaseSnapshot) decode() (current int64, row heldValue, err error) {
	if s.epoch == nil {
		return 0, row, errNoEpoch
	}
	if current, err = decodeGen(s.epoch.value); err != nil {
		return 0, row, err
	}
	row, err = decodeHeld(s.gen.value)
	return current, row, err
}

var errNoEpoch = errors.New("the epoch key is missing; run Migrate")

// busy builds the refusal of an acquisition from a snapshot that shows a current lease.
func busy(row heldValue) error {
	return &driver.BusyError{Epoch: row.epoch, Generation: row.gen, LeaseUntil: row.until}
}

// Acquire reads the resource and the epoch (one linearizable read; skipped when this driver
// has a snapshot from its own last release), takes an etcd lease granted ahead (or grants one)
// and then runs the deciding Txn, where E is the epoch read:
//
//	If   gen.ModRevision == the revision read  (nobody acquired, renewed or released since)
//	     epoch == E                             (no bump since)
//	Then gen = token(E, read+1) id NUL until, owner = id WITH the etcd lease
//
// and, when the Txn fails, reads the snapshot again and retries from it. It sends the Txn only
// when the snapshot shows the resource free: no owner key, or a lease of an earlier epoch,
// which the bump that ended it freed. A current owner key in the read already answers busy:
// that linearizable read is a moment at which the lease was held.
//
// acquireCompares: the two compares pin the whole snapshot, the owner key's absence included,
// because every Txn that creates or moves the owner key (an acquisition, a renewal) puts gen
// in the same Txn, and so moves gen's mod revision (Migrate's fold puts gen and never touches
// the owner key); what changes the
// owner key without gen only deletes it (a release also puts gen; etcd's expiry of the etcd
// lease deletes it alone), which leaves a free resource free. So an owner key that exists now
// but did not at the revision read would have failed the first compare. A third compare of
// the owner key's absence, which earlier versions sent, costs etcd a range per
// acquisition and decides nothing. What the pin needs from this driver: it never caches a
// snapshot of a resource it holds (see remember), since such a snapshot, without the owner
// that this driver's own acquisition created, would pass both compares;
// TestAcquireTwiceFromOneDriver catches that.
//
// Two acquisitions that read the same revision cannot both win: the first Txn changes the gen
// key's mod revision, so the second one's If fails inside etcd.
func (d *Driver) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	if err := checkOwner(owner); err != nil {
		return driver.Grant{}, err
	}
	if err := d.checkLayout(ctx); err != nil {
		return driver.Grant{}, err
	}
	k := d.keys(resource)
	// Until the deciding Txn is sent nothing of the resource has changed, so every error
	// before it is "not applied". The snapshot is the one this driver cached, if any (see
	// ahead.go): the Txn's compares pin it, so a stale one only costs the round trip that
	// reading would have cost.
	snap, cached := d.snapshot(resource)
	if !cached {
		read, err := d.txn(ctx, "read lease", nil, d.readLeaseOps(k), nil)
		if err != nil {
			return driver.Grant{}, driver.NotApplied(err)
		}
		snap = leaseSnapshotAt(read, 0)
	}
	if snap.gen == nil {
		return driver.Grant{}, driver.ErrNotFound
	}
	epoch, row, err := snap.decode()
	if err != nil {
		return driver.Grant{}, driver.NotApplied(fmt.Errorf("acquire: %w", err))
	}
	if snap.owner != nil && row.epoch == epoch {
		return driver.Grant{}, busy(row)
	}
	gen := row.gen

	// A lease of ahead.go in its window (ok), else one of the reuse pool kept alive once or a
	// fresh grant (reuse.go).
	lease, ok := d.takeLease(ttl)
	var own ownedLease
	if !ok {
		if own, err = d.acquisitionLease(ctx, ttl, resource, owner); err != nil {
			return driver.Grant{}, driver.NotApplied(err)
		}
		lease = aheadLease{id: own.id, ttl: own.ttl, sent: own.sent, sentWall: own.sentWall}
	}
	keep, granted := false, false
	defer func() {
		// A refused acquisition, or one that certainly did not happen, leaves nothing attached
		// to the etcd lease: it goes back to its pool (or is revoked, as cleanup). After an
		// unknown outcome the etcd lease is left alone and never reused: the acquisition may
		// have happened, and it then holds the resource until the etcd lease runs out, like
		// any holder that vanished.
		switch {
		case !keep && ok:
			d.putBack(lease)
		case !keep && own.id != 0:
			d.releasedOwned(own)
		case !granted && ok:
			d.leaseOutcomeUnknown(lease.id)
		case !granted:
			d.forgetOwned(own.id)
		}
	}()
	until := lease.sentWall.Add(time.Duration(lease.ttl) * time.Second)
	// The reads of a retry, in its Txn's Else: nil on the first attempt (see below).
	var reread []clientv3.Op
	for range acquireAttempts {
		if hook := d.ahead.reuse.beforeTxn; hook != nil {
			hook(lease.id)
		}
		value := encodeHeld(epoch, gen+1, owner, until)
		resp, err := d.txn(ctx, "acquire",
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.gen), "=", snap.gen.modRevision),
				clientv3.Compare(clientv3.Value(d.epochKey()), "=", encodeGen(epoch))},
			[]clientv3.Op{clientv3.OpPut(k.gen, value),
				clientv3.OpPut(k.owner, owner, clientv3.WithLease(lease.id))},
			reread)
		if err != nil && leaseGone(err) && !d.ahead.reuse.goneIsError {
			// etcd expired the lease after its grant or keepalive was answered and before
			// this Txn arrived (a pause), and refused the whole Txn: nothing happened. Try
			// again from the same snapshot on a lease granted now.
			if ok {
				d.leaseOutcomeUnknown(lease.id) // gone: it leaves ahead.go's pool
				ok = false
			} else {
				d.forgetOwned(own.id)
			}
			if own, err = d.grantOwned(ctx, ttl, resource, owner); err != nil {
				own = ownedLease{}
				return driver.Grant{}, driver.NotApplied(err)
			}
			lease = aheadLease{id: own.id, ttl: own.ttl, sent: own.sent, sentWall: own.sentWall}
			until = lease.sentWall.Add(time.Duration(lease.ttl) * time.Second)
			continue
		}
		if err != nil {
			d.forget(resource)
			keep = !errors.Is(err, driver.ErrNotApplied)
			return driver.Grant{}, err
		}
		if resp.Succeeded {
			keep, granted = true, true
			// Nothing is cached of a held resource: a snapshot without its owner would let the
			// next acquisition's two compares pass (see acquireCompares).
			d.forget(resource)
			d.wroteHeld(driver.LeaseRef{Resource: resource, Owner: owner, Epoch: epoch, Generation: gen + 1}, value, lease.id)
			return driver.Grant{Epoch: epoch, Generation: gen + 1, LeaseUntil: until.UTC()}, nil
		}
		// Lost a race: read the snapshot again. The first attempt carries no reads in its
		// Else, since etcd writes a whole Txn, the branch it does not take included, through
		// Raft and the WAL: the winners would pay for them. A retry carries them: under
		// contention the loser must not take two round trips (a Txn, then a read) per
		// attempt where a holder that releases and acquires again from its cached snapshot
		// takes one, or it loses every race to it (acquireAttempts in a row).
		d.forget(resource)
		read := resp
		if reread == nil {
			if read, err = d.txn(ctx, "read lease", nil, d.readLeaseOps(k), nil); err != nil {
				return driver.Grant{}, driver.NotApplied(err)
			}
			reread = d.readLeaseOps(k)
		}
		snap = leaseSnapshotAt(read, 0)
		if snap.gen == nil {
			return driver.Grant{}, driver.ErrNotFound
		}
		if epoch, row, err = snap.decode(); err != nil {
			return driver.Grant{}, driver.NotApplied(fmt.Errorf("acquire: %w", err))
		}
		if snap.owner != nil && row.epoch == epoch {
			return driver.Grant{}, busy(row)
		}
		gen = row.gen
		// Another owner acquired and already released since our read, or the epoch moved:
		// try again from what etcd just returned.
	}
	return driver.Grant{}, driver.NotApplied(fmt.Errorf("acquire: lost %d races in a row to acquisitions that released at once", acquireAttempts))
}

// holds are the compares that a lease-carrying Txn shares: the gen key holds this lease's
// token and owner (holderIs) and the store's epoch is still the lease's, so a bump fences every
// earlier lease without touching its keys; with unexpired, the owner key (alive only while its
// etcd lease is) is the lease's owner too. A released lease fails: its gen is the bare token.
//
// exact, when not empty, is the whole gen value this driver wrote for the lease (heldValueOf):
// one compare of gen with it then replaces holderIs's two. It pins the owner at least as
// tightly, since a value equal to token+owner+NUL+until is inside holderIs's range.
func (d *Driver) holds(k keys, l driver.LeaseRef, unexpired bool, exact string) []clientv3.Cmp {
	cmps := make([]clientv3.Cmp, 0, 6)
	if exact != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.Value(k.gen), "=", exact))
	} else {
		cmps = append(cmps, holderIs(k, l)...)
	}
	cmps = append(cmps, clientv3.Compare(clientv3.Value(d.epochKey()), "=", encodeGen(l.Epoch)))
	if unexpired {
		cmps = append(cmps, clientv3.Compare(clientv3.Value(k.owner), "=", l.Owner))
	}
	return cmps
}

// holderTxn sends a lease-carrying Txn whose If is holds(...) followed by more. When this
// driver wrote the gen value of the lease (its acquisition or renewal did), it first sends the
// Txn with the one exact compare of gen; if etcd refuses that, the value may have changed
// under the same holder (a renewal by another driver, or one whose outcome was unknown
// here), so the Txn is sent again with holderIs's two compares, and etcd's answer to that
// one stands. A refusal on the first Txn is certain (nothing was applied), so sending again
// is safe; it costs a refused operation a second round trip.
//
// exactThen, when not nil, replaces then in the first Txn: a release there deletes the owner
// key without reading it back (releaseOpsKnown), since the exact gen value also names the etcd
// lease the owner key is on. onLease is that etcd lease when etcd's answer is the first Txn's,
// 0 otherwise.
func (d *Driver) holderTxn(ctx context.Context, what string, k keys, l driver.LeaseRef, unexpired bool, more []clientv3.Cmp, then, exactThen []clientv3.Op) (resp *clientv3.TxnResponse, onLease clientv3.LeaseID, err error) {
	if e, ok := d.heldValueOf(l); ok {
		first := then
		if exactThen != nil {
			first = exactThen
		}
		resp, err := d.txn(ctx, what, append(d.holds(k, l, unexpired, e.value), more...), first, nil)
		if err != nil || resp.Succeeded || d.exactOnly {
			return resp, e.lease, err
		}
	}
	resp, err = d.txn(ctx, what, append(d.holds(k, l, unexpired, ""), more...), then, nil)
	return resp, 0, err
}

// heldEntry is the gen value this driver wrote for a lease it acquired or renewed, and the etcd
// lease it put the owner key on in the same Txn. Every Txn that puts the owner key puts gen with
// the token, the owner and the expiry to the nanosecond, so while gen holds this value the owner
// key, if it exists, is on this etcd lease, unless another driver renewed the same lease (same
// token and owner) with a grant sent at the same nanosecond. Then the release would hand the
// wrong etcd lease back to a pool: no key would be wrongly kept or deleted (every Txn compares
// gen and the owner key), but a later acquisition on that lease could lose its owner key early
// when the other driver revokes it. That coincidence is accepted, not tested.
type heldEntry struct {
	epoch, gen int64
	owner      string
	value      string
	lease      clientv3.LeaseID
}

// wroteHeld records the gen value that this driver's acquisition or renewal of the lease wrote,
// with the owner key's etcd lease.
func (d *Driver) wroteHeld(l driver.LeaseRef, value string, lease clientv3.LeaseID) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held == nil || len(a.held) >= maxSnapshot {
		a.held = map[string]heldEntry{}
	}
	a.held[l.Resource] = heldEntry{epoch: l.Epoch, gen: l.Generation, owner: l.Owner, value: value, lease: lease}
}

// heldValueOf returns what was recorded for the lease, if this driver wrote its gen value.
func (d *Driver) heldValueOf(l driver.LeaseRef) (heldEntry, bool) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.held[l.Resource]
	if !ok || e.epoch != l.Epoch || e.gen != l.Generation || e.owner != l.Owner {
		return heldEntry{}, false
	}
	return e, true
}

// forgetHeld drops the recorded gen value of the resource: released, or no longer known.
func (d *Driver) forgetHeld(resource string) {
	a := &d.ahead
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.held, resource)
}

// holderIs compares the gen key with the lease's token and owner: its value is
// token+owner+NUL+until exactly when token+owner < value < token+owner+"\x01", because no
// owner contains a control character (checkOwner): one that extended another owner's id would
// have to continue it with a NUL.
func holderIs(k keys, l driver.LeaseRef) []clientv3.Cmp {
	held := encodeToken(l.Epoch, l.Generation) + l.Owner
	return []clientv3.Cmp{clientv3.Compare(clientv3.Value(k.gen), ">", held),
		clientv3.Compare(clientv3.Value(k.gen), "<", held+"\x01")}
}

// Renew grants a new etcd lease with the new TTL and moves the owner key onto it, in a Txn
// that requires the token, the epoch and the owner key to be this acquisition's:
//
//	If   gen == token(e, g) id NUL *, epoch == e,  (the owner key exists only while the
//	     owner == id                               etcd lease is alive, so an expired
//	                                               lease is never revived)
//	Then read owner (its old etcd lease), owner = id WITH the new etcd lease,
//	     gen = token(e, g) id NUL until
//
// and then revokes the old etcd lease, which no key uses any more.
//
// Why not KeepAliveOnce on the existing etcd lease: it cannot change the TTL, and it is not
// conditional. Even so, a keepalive that arrives late cannot revive anything: once generation
// g's owner key has been deleted (by expiry, revocation or release) or the generation has moved
// on, every Txn of generation g fails on its token or owner compares, whatever etcd lease is
// kept alive. An etcd lease carries one acquisition's owner key at a time; one from the pool
// of leases granted ahead, or of the reuse pool, may carry a later acquisition's key after a
// release deleted the earlier one (ahead.go, reuse.go), and a keepalive on it then only
// lengthens that later lease.
// TestLateKeepAliveRevivesNothing checks the first part, and
// TestReleasedLeaseServesOneAcquisitionAtATime the second.
func (d *Driver) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	if err := checkOwner(l.Owner); err != nil {
		return time.Time{}, false, err
	}
	if err := d.checkLayout(ctx); err != nil {
		return time.Time{}, false, err
	}
	k := d.keys(l.Resource)
	sent := time.Now()
	lease, err := d.cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return time.Time{}, false, driver.NotApplied(fmt.Errorf("grant etcd lease: %w", err))
	}
	until := sent.Add(time.Duration(lease.TTL) * time.Second)
	value := encodeHeld(l.Epoch, l.Generation, l.Owner, until)
	resp, _, err := d.holderTxn(ctx, "renew", k, l, true, nil,
		[]clientv3.Op{clientv3.OpGet(k.owner),
			clientv3.OpPut(k.owner, l.Owner, clientv3.WithLease(lease.ID)),
			clientv3.OpPut(k.gen, value)}, nil)
	if err != nil {
		d.forgetHeld(l.Resource) // gen may hold either value
		// Unless the Txn certainly did not happen, the owner key may already sit on the new
		// etcd lease, so it is left alone (revoking it would end a lease its holder may still
		// be using); whichever of the two etcd leases no key uses expires on its own.
		if errors.Is(err, driver.ErrNotApplied) {
			d.revoke(ctx, lease.ID)
		}
		return time.Time{}, false, err
	}
	// The revocations are cleanup (an etcd lease no key uses expires on its own), so they run
	// in the background (revokeLater): a renewal answers after two Raft proposals, the grant
	// and the Txn, not three. Run's renewals follow one another, so a renewal that waited on a
	// third extended the trust window later on a slow member.
	if !resp.Succeeded {
		d.revokeLater(lease.ID)
		return time.Time{}, false, nil
	}
	d.wroteHeld(l, value, lease.ID)
	if old := kv(resp, 0); old != nil && old.lease != 0 {
		d.forgetOwned(clientv3.LeaseID(old.lease))
		d.revokeLater(clientv3.LeaseID(old.lease))
	}
	return until.UTC(), true, nil
}

// publishTxn is the Txn of Publish and PublishAndRelease. etcd stores the payload and records
// the operation id as accepted only where the lease holds (token, epoch, owner key present, so
// its etcd lease has not expired), the published generation is below g (fixed-width values
// compared bytewise; see encodeGen), the operation id has no record yet, and the source
// version, when given, is not older than the published one. It returns the Txn's response,
// and, when release is set, what revokeReleased needs: the index of the owner key's delete
// among the ops, and the owner key's etcd lease when the Txn etcd answered deleted it without
// reading it (holderTxn's onLease).
func (d *Driver) publishTxn(ctx context.Context, l driver.LeaseRef, pub driver.Publication, release bool) (*clientv3.TxnResponse, releasedOwner, error) {
	if len(pub.Payload) > d.maxPayload {
		return nil, releasedOwner{}, driver.NotApplied(fmt.Errorf("publish %d bytes: %w (%d bytes; etcd's default --max-request-bytes is 1.5 MiB)",
			len(pub.Payload), ErrPayloadTooLarge, d.maxPayload))
	}
	if err := checkOwner(l.Owner); err != nil {
		return nil, releasedOwner{}, err
	}
	if err := d.checkLayout(ctx); err != nil {
		return nil, releasedOwner{}, err
	}
	k := d.keys(l.Resource)
	now := time.Now()
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Value(k.pub), "<", encodeGen(l.Generation)),
		clientv3.Compare(clientv3.CreateRevision(d.opKey(pub.OpID)), "=", 0)}
	then := []clientv3.Op{
		clientv3.OpPut(k.pub, encodePub(l.Generation, l.Epoch, now, len(pub.Payload))),
		clientv3.OpPut(k.payload, string(pub.Payload)),
		clientv3.OpPut(d.opKey(pub.OpID), encodeOp(driver.Operation{Outcome: driver.OutcomeAccepted,
			Resource: l.Resource, Epoch: l.Epoch, Generation: l.Generation, RecordedAt: now})),
	}
	if sv := pub.SourceVersion; sv > 0 {
		// etcd compares with =, !=, < and > only: stored <= sv is stored < sv+1, and always
		// true for the largest sv.
		if sv < math.MaxInt64 {
			cmps = append(cmps, clientv3.Compare(clientv3.Value(k.source), "<", encodeGen(sv+1)))
		}
		then = append(then, clientv3.OpPut(k.source, encodeGen(sv)))
	}
	ownerAt := len(then)
	var exactThen []clientv3.Op
	if release {
		exactThen = append(slices.Clip(then), releaseOpsKnown(k, l)...)
		then = append(then, releaseOps(k, l)...)
	}
	resp, onLease, err := d.holderTxn(ctx, "publish", k, l, true, cmps, then, exactThen)
	return resp, releasedOwner{at: ownerAt, lease: onLease}, err
}

// releaseOps free the lease: the first deletes the owner key and returns it (its etcd lease,
// to be revoked after the Txn), which costs etcd the same range as a Get before the delete
// but one op less to carry through Raft; the second puts the bare token back in gen.
func releaseOps(k keys, l driver.LeaseRef) []clientv3.Op {
	return []clientv3.Op{clientv3.OpDelete(k.owner, clientv3.WithPrevKV()),
		clientv3.OpPut(k.gen, encodeToken(l.Epoch, l.Generation))}
}

// releaseOpsKnown are releaseOps for a Txn that compares gen with the exact value this driver
// wrote: the owner key, if it still exists, is on the etcd lease recorded with that value (see
// heldEntry for the one coincidence where it is not), so the delete reads nothing back, which saves etcd a range; its count of deleted keys
// says whether the owner key was there.
func releaseOpsKnown(k keys, l driver.LeaseRef) []clientv3.Op {
	return []clientv3.Op{clientv3.OpDelete(k.owner),
		clientv3.OpPut(k.gen, encodeToken(l.Epoch, l.Generation))}
}

// releasedOwner locates the owner key's delete in a releasing Txn's answer: the index of the
// op, and the etcd lease the key was on when the Txn did not read it back (0: it did).
type releasedOwner struct {
	at    int
	lease clientv3.LeaseID
}

func (d *Driver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	resp, _, err := d.publishTxn(ctx, l, pub, false)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

func (d *Driver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	resp, owner, err := d.publishTxn(ctx, l, pub, true)
	d.forgetHeld(l.Resource)
	if err != nil || !resp.Succeeded {
		d.releaseUnconfirmed(l.Resource, l.Owner)
		return false, err
	}
	d.remember(l.Resource, l.Epoch, l.Generation, resp.Header.Revision)
	d.revokeReleased(resp, owner)
	return true, nil
}

// Release frees the lease where the token, the epoch and the holder in gen still match,
// expired or not, like the SQL backends, and caches the released gen for this driver's next
// acquisition (ahead.go). The etcd lease is revoked afterwards, in the background; no key
// uses it any more.
func (d *Driver) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	if err := checkOwner(l.Owner); err != nil {
		return false, err
	}
	if err := d.checkLayout(ctx); err != nil {
		return false, err
	}
	k := d.keys(l.Resource)
	resp, onLease, err := d.holderTxn(ctx, "release", k, l, false, nil, releaseOps(k, l), releaseOpsKnown(k, l))
	d.forgetHeld(l.Resource)
	if err != nil || !resp.Succeeded {
		d.releaseUnconfirmed(l.Resource, l.Owner)
		return false, err
	}
	d.remember(l.Resource, l.Epoch, l.Generation, resp.Header.Revision)
	d.revokeReleased(resp, releasedOwner{at: 0, lease: onLease})
	return true, nil
}

// revokeReleased hands back the etcd lease of the owner key that the Txn's delete removed (an
// owner key that etcd had already deleted at expiry has no etcd lease to hand back): to the
// pool of leases granted ahead (ahead.go) or to the reuse pool (reuse.go), or revoked in the
// background.
func (d *Driver) revokeReleased(resp *clientv3.TxnResponse, o releasedOwner) {
	if o.lease != 0 {
		if r := resp.Responses[o.at].GetResponseDeleteRange(); r != nil && r.Deleted == 1 {
			d.released(o.lease)
		}
		return
	}
	if owner := deleted(resp, o.at); owner != nil && owner.lease != 0 {
		d.released(clientv3.LeaseID(owner.lease))
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

// Read returns the resource as one Txn (one revision) saw it. Owner is the holder in gen, which
// outlives expiry; the lease counts as held exactly while the owner key exists and its token
// is from the current epoch, as the Txns judge. A lease from an earlier epoch is reported
// without an owner, as after a release: the bump freed it, though its keys stay until its etcd
// lease runs out. etcd has no clock to read, so Now is the local clock, and where the
// informational LeaseUntil disagrees with etcd's judgement (the key outlived the local
// estimate, or the etcd lease was revoked early) Now is moved just past or just before
// LeaseUntil so that Held() tells what etcd decided.
func (d *Driver) Read(ctx context.Context, resource string) (driver.State, error) {
	if err := d.checkLayout(ctx); err != nil {
		return driver.State{}, err
	}
	k := d.keys(resource)
	resp, err := d.txn(ctx, "read", nil,
		append(d.readLeaseOps(k), clientv3.OpGet(k.pub), clientv3.OpGet(k.source)), nil)
	if err != nil {
		return driver.State{}, err
	}
	now := time.Now().UTC()
	snap := leaseSnapshotAt(resp, 0)
	if snap.gen == nil {
		return driver.State{}, driver.ErrNotFound
	}
	st := driver.State{Resource: resource, Now: now}
	var row heldValue
	if st.CurrentEpoch, row, err = snap.decode(); err != nil {
		return driver.State{}, fmt.Errorf("read %s: %w", resource, err)
	}
	st.Epoch, st.Generation = row.epoch, row.gen
	if row.held && row.epoch == st.CurrentEpoch {
		st.Owner, st.LeaseUntil = row.owner, row.until
	}
	switch held := snap.owner != nil && st.Owner != ""; {
	case held && !st.LeaseUntil.After(now):
		st.Now = st.LeaseUntil.Add(-time.Nanosecond)
	case !held && st.LeaseUntil.After(now):
		st.Now = st.LeaseUntil
	}
	if pub := kv(resp, 3); pub != nil {
		p, err := decodePub(pub.value)
		if err != nil {
			return driver.State{}, err
		}
		st.PublishedGeneration, st.PublishedEpoch, st.PublishedAt, st.PayloadSize = p.generation, p.epoch, p.at, p.size
	}
	if sv := kv(resp, 4); sv != nil {
		if st.SourceVersion, err = decodeGen(sv.value); err != nil {
			return driver.State{}, err
		}
	}
	return st, nil
}

func (d *Driver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	k := d.keys(resource)
	resp, err := d.txn(ctx, "read payload", nil,
		[]clientv3.Op{clientv3.OpGet(k.gen, clientv3.WithKeysOnly()), clientv3.OpGet(k.pub), clientv3.OpGet(k.payload)}, nil)
	if err != nil {
		return nil, 0, err
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

// ResolveOperation records the id as aborted unless an outcome is recorded, and reads the
// record, in one Txn:
//
//	If   op.CreateRevision == 0
//	Then op = aborted, read op
//	Else read op
//
// A publication carrying the id requires op.CreateRevision == 0 in its own Txn, so whichever
// of the two etcd serializes first decides, and the answer is final.
func (d *Driver) ResolveOperation(ctx context.Context, opID string) (driver.Operation, error) {
	key := d.opKey(opID)
	resp, err := d.txn(ctx, "resolve operation",
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(key, encodeOp(driver.Operation{Outcome: driver.OutcomeAborted, RecordedAt: time.Now()})),
			clientv3.OpGet(key)},
		[]clientv3.Op{clientv3.OpGet(key)})
	if err != nil {
		return driver.Operation{OpID: opID}, err
	}
	i := 0
	if resp.Succeeded {
		i = 1
	}
	rec := kv(resp, i)
	if rec == nil {
		return driver.Operation{OpID: opID}, fmt.Errorf("resolve operation %s: the record is missing after the Txn", opID)
	}
	return decodeOp(opID, rec.value)
}

func (d *Driver) ReadOperation(ctx context.Context, opID string) (driver.Operation, error) {
	resp, err := d.txn(ctx, "read operation", nil, []clientv3.Op{clientv3.OpGet(d.opKey(opID))}, nil)
	if err != nil {
		return driver.Operation{OpID: opID}, err
	}
	if rec := kv(resp, 0); rec != nil {
		return decodeOp(opID, rec.value)
	}
	return driver.Operation{OpID: opID}, nil
}

// bumpAttempts bounds the compare-and-swap retries of BumpEpoch against concurrent bumps.
const bumpAttempts = 16

// epochClock is the clock epochs are taken from: this client's, in microseconds since 1970
// (etcd has none; see Epochs in the package documentation).
func epochClock() int64 { return time.Now().UnixMicro() }

// BumpEpoch sets the epoch key to max(epoch + 1, this client's clock in microseconds) with a
// compare-and-swap on its mod revision, retried when
// another bump got there first. That one key is all a bump changes: every lease-carrying Txn
// compares the lease's epoch with it, Acquire treats a lease of an earlier epoch as free, and
// Read reports it so. Deleting every owner key in the same Txn instead would be bounded by
// etcd's --max-txn-ops (128 by default), which a store with more resources exceeds.
func (d *Driver) BumpEpoch(ctx context.Context) (int64, error) {
	for range bumpAttempts {
		resp, err := d.txn(ctx, "read epoch", nil, []clientv3.Op{clientv3.OpGet(d.epochKey())}, nil)
		if err != nil {
			return 0, driver.NotApplied(err)
		}
		cur := kv(resp, 0)
		if cur == nil {
			return 0, driver.NotApplied(errNoEpoch)
		}
		epoch, err := decodeGen(cur.value)
		if err != nil {
			return 0, driver.NotApplied(fmt.Errorf("the stored epoch: %w", err))
		}
		next := max(epoch+1, epochClock())
		resp, err = d.txn(ctx, "bump epoch",
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(d.epochKey()), "=", cur.modRevision)},
			[]clientv3.Op{clientv3.OpPut(d.epochKey(), encodeGen(next))}, nil)
		if err != nil {
			return 0, err
		}
		if resp.Succeeded {
			return next, nil
		}
	}
	return 0, driver.NotApplied(fmt.Errorf("lost %d races in a row to other bumps", bumpAttempts))
}

// pruneBatch bounds the keys one prune Txn deletes, below etcd's default --max-txn-ops (128;
// each key takes one compare and one delete).
const pruneBatch = 64

// PruneOperations deletes the operation records older than age. etcd has no clock, so the age
// is judged by recorded_at, written from the recording client's clock, against this client's
// clock: choose an age far above any clock difference between them (hours, not seconds).
// Records are listed page by page and deleted in Txns that compare each key's mod revision
// with the one listed, so a record pruned and then recreated in between (a Resolve writing
// "aborted") is never deleted unseen. The prune as a whole is not one atomic step.
func (d *Driver) PruneOperations(ctx context.Context, age time.Duration) (int64, error) {
	cutoff := time.Now().Add(-age)
	from, end := d.opsPrefix(), clientv3.GetPrefixRangeEnd(d.opsPrefix())
	var deleted int64
	for {
		resp, err := d.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(pruneBatch))
		if err != nil {
			return deleted, fmt.Errorf("list operations: %w", err)
		}
		var old []*kvPair
		var keys []string
		for _, kv := range resp.Kvs {
			key := string(kv.Key)
			if !strings.HasSuffix(key, opSuffix) {
				continue // a key of a resource whose name starts with "ops/"
			}
			op, err := decodeOp(strings.TrimSuffix(strings.TrimPrefix(key, d.opsPrefix()), opSuffix), kv.Value)
			if err != nil {
				return deleted, err
			}
			if op.RecordedAt.Before(cutoff) {
				old = append(old, &kvPair{modRevision: kv.ModRevision})
				keys = append(keys, key)
			}
		}
		n, err := d.deleteUnchanged(ctx, keys, old)
		deleted += n
		if err != nil {
			return deleted, err
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return deleted, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// deleteUnchanged deletes the keys whose mod revision is still the one listed: in one Txn
// when none changed, else one Txn per key.
func (d *Driver) deleteUnchanged(ctx context.Context, keys []string, listed []*kvPair) (int64, error) {
	txn := func(keys []string, listed []*kvPair) (bool, error) {
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for i, k := range keys {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", listed[i].modRevision))
			ops = append(ops, clientv3.OpDelete(k))
		}
		resp, err := d.txn(ctx, "prune operations", cmps, ops, nil)
		return err == nil && resp.Succeeded, err
	}
	if len(keys) == 0 {
		return 0, nil
	}
	ok, err := txn(keys, listed)
	if err != nil || ok {
		if ok {
			return int64(len(keys)), nil
		}
		return 0, err
	}
	var n int64
	for i := range keys {
		ok, err := txn(keys[i:i+1], listed[i:i+1])
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}
