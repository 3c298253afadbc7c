package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/backend/mysql"
	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/backend/redis"
	"github.com/fenced-dev/fenced/backend/sqlite"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
	"github.com/fenced-dev/fenced/driver"
)

// storeCopier takes the restore fault's copy of the store and restores it.
type storeCopier interface {
	take(ctx context.Context) (map[string]torture.State, error)
	restore(ctx context.Context) error
	drop(ctx context.Context)
}

// storeCopy is the restore fault's copy of a SQL store: the rows of the torture's resources,
// their operation records and the store's epoch, in tables of their own beside the store's,
// as a logical backup (pg_dump, mariadb-dump, VACUUM INTO) of those rows would hold them. The
// restore puts them back in one transaction, the epoch included, like restoring that backup;
// everything outside the torture's resources is left alone.
type storeCopy struct {
	exec    func(ctx context.Context, stmts ...string) error // in one transaction
	query   func(ctx context.Context, stmt string) (*sqlRows, error)
	tables  [3]string // resources, operations, meta copies
	pattern string    // the torture's resources, as a LIKE pattern
}

// sqlRows is the copy's rows, read eagerly (the engines' row types differ).
type sqlRows struct{ rows [][]any }

// newStoreCopy returns the copier for drv, or why the restore fault does not apply. An etcd
// store is copied as a snapshot into snapshotPath and put back by restoreCmd.
func newStoreCopy(drv driver.Driver, runID string, resources []string, snapshotPath, restoreCmd, rawURL string) (storeCopier, error) {
	switch d := drv.(type) {
	case *redis.Driver:
		return &redisCopy{d: d, resources: resources}, nil
	case *etcd.Driver:
		if err := etcdRestoreApplies(restoreCmd); err != nil {
			return nil, err
		}
		addr, err := portToWait(rawURL, "restore")
		if err != nil {
			return nil, err
		}
		return &etcdCopy{d: d, resources: resources, path: snapshotPath, command: restoreCmd, addr: addr}, nil
	}
	c := &storeCopy{pattern: "torture-" + runID + "-%"}
	for i, n := range []string{"resources", "operations", "meta"} {
		c.tables[i] = "torture_copy_" + runID + "_" + n
	}
	switch d := drv.(type) {
	case *sqlite.Driver:
		c.exec, c.query = sqlExec(d.DB()), sqlQuery(d.DB())
	case *mysql.Driver:
		c.exec, c.query = sqlExec(d.DB()), sqlQuery(d.DB())
	case *postgres.Driver:
		pool := d.Pool()
		c.exec = func(ctx context.Context, stmts ...string) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return uncommitted{err}
			}
			for _, s := range stmts {
				if _, err := tx.Exec(ctx, s); err != nil {
					_ = tx.Rollback(ctx)
					return uncommitted{err}
				}
			}
			return tx.Commit(ctx)
		}
		c.query = func(ctx context.Context, stmt string) (*sqlRows, error) {
			rows, err := pool.Query(ctx, stmt)
			if err != nil {
				return nil, err
			}
			out := &sqlRows{}
			for rows.Next() {
				v, err := rows.Values()
				if err != nil {
					rows.Close()
					return nil, err
				}
				out.rows = append(out.rows, v)
			}
			return out, rows.Err()
		}
	default:
		return nil, errors.New("not implemented for this backend: the restore fault copies SQL tables (SQLite, PostgreSQL, MariaDB), Redis keys or an etcd snapshot")
	}
	return c, nil
}

// uncommitted is an error from a transaction that failed before its COMMIT was sent: the
// server rolls it back (explicitly, or when the connection goes), so its data statements did
// not take effect. (On MariaDB a CREATE or DROP TABLE among them commits by itself.)
type uncommitted struct{ err error }

func (e uncommitted) Error() string { return e.err.Error() }
func (e uncommitted) Unwrap() error { return e.err }

func sqlExec(db *sql.DB) func(ctx context.Context, stmts ...string) error {
	return func(ctx context.Context, stmts ...string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return uncommitted{err}
		}
		for _, s := range stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				_ = tx.Rollback()
				return uncommitted{err}
			}
		}
		return tx.Commit()
	}
}

func sqlQuery(db *sql.DB) func(ctx context.Context, stmt string) (*sqlRows, error) {
	return func(ctx context.Context, stmt string) (*sqlRows, error) {
		rows, err := db.QueryContext(ctx, stmt)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		cols, err := rows.Columns()
		if err != nil {
			return nil, err
		}
		out := &sqlRows{}
		for rows.Next() {
			v := make([]any, len(cols))
			p := make([]any, len(cols))
			for i := range v {
				p[i] = &v[i]
			}
			if err := rows.Scan(p...); err != nil {
				return nil, err
			}
			out.rows = append(out.rows, v)
		}
		return out, rows.Err()
	}
}

// take copies the store. MariaDB commits each CREATE TABLE on its own; the copy is still of one
// moment because the workers are held at the barrier while it is taken.
func (c *storeCopy) take(ctx context.Context) (map[string]torture.State, error) {
	r, o, m := c.tables[0], c.tables[1], c.tables[2]
	var stmts []string
	for _, t := range c.tables {
		stmts = append(stmts, "DROP TABLE IF EXISTS "+t)
	}
	stmts = append(stmts,
		"CREATE TABLE "+r+" AS SELECT * FROM fenced_resources WHERE resource LIKE '"+c.pattern+"'",
		"CREATE TABLE "+o+" AS SELECT * FROM fenced_operations WHERE resource LIKE '"+c.pattern+"'",
		"CREATE TABLE "+m+" AS SELECT epoch FROM fenced_meta")
	if err := c.exec(ctx, stmts...); err != nil {
		return nil, fmt.Errorf("copy the store: %w", err)
	}
	return c.read(ctx)
}

// read returns what the copy holds for each resource.
func (c *storeCopy) read(ctx context.Context) (map[string]torture.State, error) {
	rows, err := c.query(ctx, "SELECT r.resource, m.epoch, r.generation, r.lease_owner, r.published_generation, r.payload FROM "+
		c.tables[0]+" r CROSS JOIN "+c.tables[2]+" m")
	if err != nil {
		return nil, fmt.Errorf("read the copy: %w", err)
	}
	out := map[string]torture.State{}
	for _, v := range rows.rows {
		st := torture.State{Epoch: asInt(v[1]), Generation: asInt(v[2]), Owner: asString(v[3]),
			PublishedGeneration: asInt(v[4]), Payload: asString(v[5])}
		out[asString(v[0])] = st
	}
	return out, nil
}

// restore puts the copy back in one transaction: the torture's rows, their operation records
// and the epoch as they were when the copy was taken. A failure before the COMMIT is
// driver.ErrNotApplied (the restore is recorded as failed, not unknown: the checker then
// keeps the checks a restore turns off); one at the COMMIT is an unknown outcome.
func (c *storeCopy) restore(ctx context.Context) error {
	err := c.exec(ctx,
		"DELETE FROM fenced_operations WHERE resource LIKE '"+c.pattern+"'",
		"DELETE FROM fenced_resources WHERE resource LIKE '"+c.pattern+"'",
		"INSERT INTO fenced_resources SELECT * FROM "+c.tables[0],
		"INSERT INTO fenced_operations SELECT * FROM "+c.tables[1],
		"UPDATE fenced_meta SET epoch = (SELECT epoch FROM "+c.tables[2]+")")
	if errors.As(err, new(uncommitted)) {
		return fmt.Errorf("restore the copy: %w before the commit: %w", driver.ErrNotApplied, err)
	}
	if err != nil {
		return fmt.Errorf("restore the copy: %w", err)
	}
	return nil
}

// drop removes the copy's tables.
func (c *storeCopy) drop(ctx context.Context) {
	var stmts []string
	for _, t := range c.tables {
		stmts = append(stmts, "DROP TABLE IF EXISTS "+t)
	}
	_ = c.exec(ctx, stmts...)
}

// redisCopy is the restore fault's copy of a Redis store: DUMP of each resource's hash and of
// the epoch key, put back with RESTORE … REPLACE in one MULTI, as restoring an RDB copy would
// put them back (the incarnation key is left alone: the server is the same one, so only the
// bump can fence the old tokens). Operation records are not copied; the torture never
// resolves operations.
type redisCopy struct {
	d         *redis.Driver
	resources []string
	dumps     map[string]string
}

func (c *redisCopy) keys() []string {
	keys := []string{c.d.EpochKey()}
	for _, r := range c.resources {
		keys = append(keys, c.d.Key(r))
	}
	return keys
}

func (c *redisCopy) take(ctx context.Context) (map[string]torture.State, error) {
	cli := c.d.Client()
	keys := c.keys()
	dumps := make([]*goredis.StringCmd, len(keys))
	rows := make([]*goredis.SliceCmd, len(keys))
	var storeEpoch *goredis.StringCmd
	_, err := cli.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		storeEpoch = p.Get(ctx, c.d.EpochKey())
		for i, k := range keys {
			dumps[i] = p.Dump(ctx, k)
			if i > 0 {
				rows[i] = p.HMGet(ctx, k, "generation", "owner", "published_generation", "payload", "epoch")
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("copy the store: %w", err)
	}
	c.dumps = map[string]string{}
	for i, k := range keys {
		c.dumps[k] = dumps[i].Val()
	}
	epoch, _ := strconv.ParseInt(storeEpoch.Val(), 10, 64)
	out := map[string]torture.State{}
	for i, r := range c.resources {
		v := rows[i+1].Val()
		// A lease from an earlier epoch is no lease: a bump (the nemesis's, or the one a
		// restarted server's scripts make by themselves) freed it without touching the hash,
		// and the backend's reads report it so. The model freed it at that bump too.
		owner := asString(v[1])
		if asString(v[4]) != storeEpoch.Val() {
			owner = ""
		}
		out[r] = torture.State{Epoch: epoch, Generation: asRedisInt(v[0]), Owner: owner,
			PublishedGeneration: asRedisInt(v[2]), Payload: asString(v[3])}
	}
	return out, nil
}

func (c *redisCopy) restore(ctx context.Context) error {
	_, err := c.d.Client().TxPipelined(ctx, func(p goredis.Pipeliner) error {
		for _, k := range c.keys() {
			p.RestoreReplace(ctx, k, 0, c.dumps[k])
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("restore the copy: %w", err)
	}
	return nil
}

func (c *redisCopy) drop(context.Context) {}

func asRedisInt(v any) int64 {
	n, _ := strconv.ParseInt(asString(v), 10, 64)
	return n
}

func asInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case int32:
		return int64(x)
	case int:
		return int64(x)
	case uint64:
		return int64(x)
	case []byte:
		var n int64
		_, _ = fmt.Sscan(string(x), &n)
		return n
	}
	return 0
}

func asString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	return ""
}

// eventCopy marks the restore fault's copy on the timeline.
const eventCopy = "copy"

// nemesisOps records one nemesis operation per resource (so that each resource's model sees
// it), runs do, and records each operation's return as ret describes it; an error is an
// unknown outcome unless it is driver.ErrNotApplied (failed).
func (t *tortureRun) nemesisOps(call func(res string) torture.Record, do func() error, ret func(res string) torture.Record) error {
	ids := make([]int64, len(t.resources))
	for i, res := range t.resources {
		r := call(res)
		r.Resource = res
		ids[i], _ = t.nem.Call(r)
	}
	err := do()
	for i, res := range t.resources {
		r := torture.Record{Kind: torture.KindReturn, ID: ids[i], Out: torture.OutUnknown}
		if errors.Is(err, driver.ErrNotApplied) {
			r.Out = torture.OutFailed
		}
		if err == nil {
			r = ret(res)
			r.Kind, r.ID = torture.KindReturn, ids[i]
		} else {
			r.Err = err.Error()
		}
		_ = t.nem.Write(r)
	}
	return err
}

// holdPastCopy returns with the barrier held once a resource's token (epoch, generation) is
// past the one in snap, reading the store with the workers held, and letting them go on between
// reads. It gives up, with the barrier released, when less than two seconds of the run are left
// (too late for the workers to be handed the restored tokens again).
func (t *tortureRun) holdPastCopy(ctx context.Context, snap map[string]torture.State) error {
	for {
		for _, r := range t.resources {
			st, err := t.drv.Read(ctx, r)
			if err != nil {
				t.barrier.Release()
				return fmt.Errorf("read %s: %w", r, err)
			}
			s := snap[r]
			if st.CurrentEpoch != s.Epoch || st.Generation > s.Generation {
				return nil
			}
		}
		t.barrier.Release()
		if time.Until(t.end()) < 2*time.Second {
			return errors.New("no acquisition went past the copy before the end of the run")
		}
		if !wait(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
		if err := t.barrier.Hold(ctx, 10*time.Second); err != nil {
			return err
		}
	}
}

// bump is the bump fault, and the bump after a restore: fenced epoch bump, recorded on every
// resource. A bump that failed is recorded with its error (the report counts it apart).
func (t *tortureRun) bump(ctx context.Context) (int64, error) {
	begin := torture.Now()
	var epoch int64
	err := t.nemesisOps(func(string) torture.Record { return torture.Record{Op: torture.OpBump} },
		func() (err error) { epoch, err = t.drv.BumpEpoch(ctx); return err },
		func(string) torture.Record { return torture.Record{Out: torture.OutOK, Epoch: epoch} })
	rec := torture.Record{Kind: torture.KindEvent, Event: torture.FaultBump, Time: begin, EndTime: torture.Now(), Epoch: epoch,
		Detail: fmt.Sprintf("epoch bumped to %d", epoch)}
	if err != nil {
		rec.Detail, rec.Err = "epoch bump: "+err.Error(), err.Error()
	}
	_ = t.nem.Write(rec)
	return epoch, err
}

// restoreFault copies the store with the workers held at the barrier, lets them go on for
// f.After, then holds them again, restores the copy and (unless --restore-without-bump) bumps
// the epoch before letting them go: the order an operator restoring a backup would follow.
func (t *tortureRun) restoreFault(ctx context.Context, f torture.Fault) {
	event := func(begin int64, detail string) {
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultRestore, Time: begin, EndTime: torture.Now(), Detail: detail})
	}
	// A restore that did not happen is not counted as injected (the report says it failed).
	failed := func(begin int64, err error) {
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultRestore, Time: begin, EndTime: torture.Now(),
			Detail: "not restored", Err: err.Error()})
	}
	begin := torture.Now()
	if err := t.barrier.Hold(ctx, 10*time.Second); err != nil {
		failed(begin, fmt.Errorf("copy: %w", err))
		return
	}
	var snap map[string]torture.State
	err := t.nemesisOps(func(string) torture.Record { return torture.Record{Op: torture.OpSnapshot} },
		func() (err error) { snap, err = t.copier.take(ctx); return err },
		func(res string) torture.Record {
			s := snap[res]
			return torture.Record{Out: torture.OutOK, StoreEpoch: s.Epoch, Gen: s.Generation, ReadOwner: s.Owner,
				ReadPub: s.PublishedGeneration, Payload: s.Payload}
		})
	t.barrier.Release()
	copied := torture.Now()
	if err != nil {
		failed(begin, err)
		return
	}
	_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: eventCopy, Time: begin, EndTime: copied,
		Detail: fmt.Sprintf("store copied; restored in %s", f.After.Round(time.Millisecond))})
	if !wait(ctx, f.After) {
		return
	}
	if err := t.barrier.Hold(ctx, 10*time.Second); err != nil {
		failed(begin, fmt.Errorf("restore: %w", err))
		return
	}
	if t.o.restoreWithoutBump {
		// The control must roll acknowledged acquisitions back, or it shows nothing: it
		// restores only once some resource's token has gone past the copy's.
		if err := t.holdPastCopy(ctx, snap); err != nil {
			failed(begin, fmt.Errorf("restore: %w", err))
			return
		}
	}
	defer t.barrier.Release()
	restoring := torture.Now()
	err = t.nemesisOps(func(res string) torture.Record {
		s := snap[res]
		return torture.Record{Op: torture.OpRestore, StoreEpoch: s.Epoch, Gen: s.Generation, Owner: s.Owner,
			ReadPub: s.PublishedGeneration, Payload: s.Payload}
	}, func() error { return t.copier.restore(ctx) },
		func(string) torture.Record { return torture.Record{Out: torture.OutOK} })
	if err != nil {
		failed(restoring, err)
		return
	}
	// The note says the bump only once it is made: a failed one leaves the old tokens valid.
	how := "WITHOUT an epoch bump (--restore-without-bump)"
	if !t.o.restoreWithoutBump {
		if epoch, err := t.bump(ctx); err != nil {
			how = "but the epoch bump after it FAILED: " + err.Error()
		} else {
			how = fmt.Sprintf("then the epoch bumped to %d", epoch)
		}
	}
	event(restoring, fmt.Sprintf("the copy taken %s before restored, %s", time.Duration(restoring-copied).Round(time.Millisecond), how))
}
