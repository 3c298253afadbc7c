package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/driver"
)

// foldAttempts bounds the retries of one resource's fold against concurrent writes (of a
// version 2 driver still running).
const foldAttempts = 16

// fold converts a version 2 store into version 3: it lists the keys under the prefix page by
// page and folds each resource's holder and until keys into its gen key (foldResource), then
// records version 3 with a compare-and-swap on version 2. It is not one atomic step: a fold
// interrupted half-way is finished by the next Migrate, which skips the resources already
// folded. A version 2 driver still running refuses a folded gen (decodeToken wants exactly
// 40 bytes) and so should fail closed on it (read from its code, not tested), but it may still write version 2 keys beside folded ones
// until it stops: stop every client running an older fenced before migrating.
func (d *Driver) fold(ctx context.Context) error {
	from, end := d.prefix, clientv3.GetPrefixRangeEnd(d.prefix)
	for {
		resp, err := d.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(pruneBatch), clientv3.WithKeysOnly())
		if err != nil {
			return fmt.Errorf("migrate to schema %d: list keys: %w", schemaVersion, err)
		}
		for _, kv := range resp.Kvs {
			if base, ok := strings.CutSuffix(string(kv.Key), "/gen"); ok {
				if err := d.foldResource(ctx, base+"/"); err != nil {
					return fmt.Errorf("migrate to schema %d: %w", schemaVersion, err)
				}
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	_, err := d.txn(ctx, "record schema version",
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(d.schemaKey()), "=", "2")},
		[]clientv3.Op{clientv3.OpPut(d.schemaKey(), fmt.Sprint(schemaVersion))}, nil)
	return err
}

// foldResource folds one resource's version 2 keys under base: gen (the bare token), holder
// and until become gen = token holder NUL until (the bare token where there is no holder), and
// holder and until are deleted, in one Txn pinned on the three keys' mod revisions (0: absent),
// so that nothing written in between is lost. A gen longer than a token is folded already. The
// owner key is left as it is: a lease held across the migration stays held, on its etcd lease.
func (d *Driver) foldResource(ctx context.Context, base string) error {
	gen, holder, until := base+"gen", base+"holder", base+"until"
	for range foldAttempts {
		read, err := d.txn(ctx, "read version 2 keys", nil,
			[]clientv3.Op{clientv3.OpGet(gen), clientv3.OpGet(holder), clientv3.OpGet(until)}, nil)
		if err != nil {
			return err
		}
		g, h, u := kv(read, 0), kv(read, 1), kv(read, 2)
		if g == nil || len(g.value) != 2*genWidth {
			return nil // deleted, or folded already
		}
		epoch, generation, err := decodeToken(g.value)
		if err != nil {
			return fmt.Errorf("%s: %w", gen, err)
		}
		value := string(g.value)
		if h != nil {
			if err := checkOwner(string(h.value)); err != nil {
				return fmt.Errorf("%s: %w", holder, err)
			}
			var at time.Time
			if u != nil {
				if at, err = decodeTime(u.value); err != nil {
					return fmt.Errorf("%s: %w", until, err)
				}
			}
			value = encodeHeld(epoch, generation, string(h.value), at)
		}
		rev := func(p *kvPair) int64 {
			if p == nil {
				return 0
			}
			return p.modRevision
		}
		resp, err := d.txn(ctx, "fold version 2 keys",
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(gen), "=", g.modRevision),
				clientv3.Compare(clientv3.ModRevision(holder), "=", rev(h)),
				clientv3.Compare(clientv3.ModRevision(until), "=", rev(u))},
			[]clientv3.Op{clientv3.OpPut(gen, value), clientv3.OpDelete(holder), clientv3.OpDelete(until)}, nil)
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("%s: changed %d times while folding; stop the clients running an older fenced", gen, foldAttempts)
}

// ErrNotMigrated is returned, not applied, by every operation of a driver opened on a store
// that an older fenced wrote (key layout version 2) and that has not been migrated since
// (fenced.Config.SkipMigrate, or a driver used directly): run `fenced migrate` (Migrate) first.
var ErrNotMigrated = errors.New("the store is in an older key layout; stop the clients running an older fenced and run `fenced migrate`")

// checkLayout refuses, before anything is sent, to work on a store whose recorded layout is not
// this driver's: in a version 2 store the holder lives in keys of its own, so this driver's
// compares would read a held lease as free or released, and its writes would leave folded gen
// keys beside a version 2 driver's holder keys. The check reads the schema key once per driver
// and is remembered once it found this layout (or Migrate recorded it): a layout only ever
// moves forward. A store without a schema key is left to the operations themselves, which
// refuse it for its missing epoch key.
func (d *Driver) checkLayout(ctx context.Context) error {
	if d.layoutOK.Load() {
		return nil
	}
	resp, err := d.txn(ctx, "read schema version", nil, []clientv3.Op{clientv3.OpGet(d.schemaKey())}, nil)
	if err != nil {
		return driver.NotApplied(err)
	}
	v := kv(resp, 0)
	switch {
	case v == nil:
		return nil
	case string(v.value) != fmt.Sprint(schemaVersion):
		return driver.NotApplied(fmt.Errorf("%s holds layout version %q, this driver writes %d: %w",
			d.schemaKey(), v.value, schemaVersion, ErrNotMigrated))
	}
	d.layoutOK.Store(true)
	return nil
}
