package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5/pgxpool"
	goredislib "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fenced-dev/fenced"
)

const benchTTL = time.Minute

// fencedSystem drives a fenced store; its resources are provisioned on first use.
func fencedSystem(name, server string, st *fenced.Store, staleTTL time.Duration) system {
	var provisioned sync.Map
	provision := func(ctx context.Context, resource string) error {
		if _, ok := provisioned.Load(resource); ok {
			return nil
		}
		if err := st.Provision(ctx, resource); err != nil {
			return err
		}
		provisioned.Store(resource, true)
		return nil
	}
	return system{
		name: name, server: server,
		lock: func(ctx context.Context, resource string) (held, error) {
			if err := provision(ctx, resource); err != nil {
				return nil, err
			}
			l, err := st.Acquire(ctx, resource, benchTTL)
			if errors.Is(err, fenced.ErrBusy) {
				return nil, errBusy
			}
			if err != nil {
				return nil, err
			}
			return fencedHeld{l}, nil
		},
		crash: func(ctx context.Context, resource string) (time.Duration, error) {
			if err := provision(ctx, resource); err != nil {
				return 0, err
			}
			start := time.Now()
			if _, err := st.Acquire(ctx, resource, staleTTL); err != nil { // and never released
				return 0, err
			}
			return takeOver(ctx, start.Add(staleTTL), func() (bool, error) {
				b, err := st.Acquire(ctx, resource, benchTTL)
				if errors.Is(err, fenced.ErrBusy) {
					return false, nil
				}
				if err == nil {
					err = b.Release(ctx)
				}
				return err == nil, err
			})
		},
		stale: func(ctx context.Context, resource string) (bool, error) {
			if err := provision(ctx, resource); err != nil {
				return false, err
			}
			a, err := st.Acquire(ctx, resource, staleTTL)
			if err != nil {
				return false, err
			}
			// A pauses; its lease runs out; B takes the resource.
			for {
				b, err := st.Acquire(ctx, resource, benchTTL)
				if errors.Is(err, fenced.ErrBusy) {
					time.Sleep(staleTTL / 10)
					continue
				}
				if err != nil {
					return false, err
				}
				defer func() { _ = b.Release(ctx) }()
				break
			}
			// A wakes up and writes: Publish asks the database even though A's trust window
			// has ended, so the refusal is the destination's.
			err = a.Publish(ctx, []byte("stale"))
			if err != nil && !errors.Is(err, fenced.ErrRefused) {
				return false, err
			}
			return err != nil, nil
		},
	}
}

type fencedHeld struct{ l *fenced.Lease }

func (h fencedHeld) write(ctx context.Context, p []byte) error { return h.l.PublishAndRelease(ctx, p) }
func (h fencedHeld) release(ctx context.Context) error         { return h.l.Release(ctx) }

// advisorySystem: pg_try_advisory_lock on a connection held while locked; the write is an
// UPSERT of the resource's row.
func advisorySystem(pool *pgxpool.Pool) system {
	key := func(resource string) int64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(resource))
		return int64(h.Sum64())
	}
	lock := func(ctx context.Context, resource string) (*advisoryHeld, error) {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		var ok bool
		if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key(resource)).Scan(&ok); err != nil {
			c.Release()
			return nil, err
		}
		if !ok {
			c.Release()
			return nil, errBusy
		}
		return &advisoryHeld{c: c, key: key(resource), resource: resource}, nil
	}
	return system{
		name: "PostgreSQL advisory lock", server: "PostgreSQL",
		lock: func(ctx context.Context, resource string) (held, error) {
			h, err := lock(ctx, resource)
			if err != nil {
				return nil, err
			}
			return h, nil
		},
		crash: func(ctx context.Context, resource string) (time.Duration, error) {
			start := time.Now()
			a, err := lock(ctx, resource)
			if err != nil {
				return 0, err
			}
			_ = a.c.Conn().Close(ctx) // the holder's process dies: its connection closes
			a.c.Release()
			return takeOver(ctx, start, func() (bool, error) {
				b, err := lock(ctx, resource)
				if errors.Is(err, errBusy) {
					return false, nil
				}
				if err == nil {
					err = b.release(ctx)
				}
				return err == nil, err
			})
		},
		stale: func(ctx context.Context, resource string) (bool, error) {
			a, err := lock(ctx, resource)
			if err != nil {
				return false, err
			}
			defer func() {
				_ = a.c.Conn().Close(ctx) // its session was ended: the pool must not reuse it
				a.c.Release()
			}()
			// A pauses; the server ends its idle session (as idle_session_timeout or a
			// network timeout would), which frees the lock; B takes it.
			pid := a.c.Conn().PgConn().PID()
			if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
				return false, fmt.Errorf("terminate A's session: %w", err)
			}
			var b *advisoryHeld
			for {
				if b, err = lock(ctx, resource); errors.Is(err, errBusy) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					return false, fmt.Errorf("the second client locks: %w", err)
				}
				break
			}
			defer func() { _ = b.release(ctx) }()
			// A wakes up and writes, on a connection of its pool: nothing refuses it.
			if _, err = pool.Exec(ctx, upsert, resource, []byte("stale")); err != nil {
				return false, fmt.Errorf("the paused holder writes: %w", err)
			}
			return false, nil
		},
	}
}

const upsert = `INSERT INTO peers_data (resource, payload) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET payload = excluded.payload`

type advisoryHeld struct {
	c        *pgxpool.Conn
	key      int64
	resource string
}

func (h *advisoryHeld) write(ctx context.Context, p []byte) error {
	if _, err := h.c.Exec(ctx, upsert, h.resource, p); err != nil {
		h.c.Release()
		return err
	}
	return h.release(ctx)
}

func (h *advisoryHeld) release(ctx context.Context) error {
	defer h.c.Release()
	_, err := h.c.Exec(ctx, "SELECT pg_advisory_unlock($1)", h.key)
	return err
}

// redsyncSystem: one try, no retry delay; the write is a SET.
func redsyncSystem(cli *goredislib.Client, prefix string) system {
	rs := redsync.New(goredis.NewPool(cli))
	lock := func(ctx context.Context, resource string, ttl time.Duration) (*redsync.Mutex, error) {
		m := rs.NewMutex(prefix+"redsync:"+resource, redsync.WithTries(1), redsync.WithExpiry(ttl))
		err := m.LockContext(ctx)
		var taken *redsync.ErrTaken
		if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
			return nil, errBusy
		}
		return m, err
	}
	return system{
		name: "redsync", server: "Redis",
		lock: func(ctx context.Context, resource string) (held, error) {
			m, err := lock(ctx, resource, benchTTL)
			if err != nil {
				return nil, err
			}
			return redsyncHeld{m, cli, prefix + "data:" + resource}, nil
		},
		crash: func(ctx context.Context, resource string) (time.Duration, error) {
			const ttl = 50 * time.Millisecond
			start := time.Now()
			if _, err := lock(ctx, resource, ttl); err != nil {
				return 0, err
			}
			return takeOver(ctx, start.Add(ttl), func() (bool, error) {
				b, err := lock(ctx, resource, benchTTL)
				if errors.Is(err, errBusy) {
					return false, nil
				}
				if err == nil {
					_, err = b.UnlockContext(ctx)
				}
				return err == nil, err
			})
		},
		stale: func(ctx context.Context, resource string) (bool, error) {
			const ttl = 50 * time.Millisecond
			if _, err := lock(ctx, resource, ttl); err != nil {
				return false, err
			}
			for { // A pauses past its expiry; B takes the lock
				b, err := lock(ctx, resource, benchTTL)
				if errors.Is(err, errBusy) {
					time.Sleep(ttl / 10)
					continue
				}
				if err != nil {
					return false, err
				}
				defer func() { _, _ = b.UnlockContext(ctx) }()
				break
			}
			return false, cli.Set(ctx, prefix+"data:"+resource, "stale", 0).Err()
		},
	}
}

type redsyncHeld struct {
	m   *redsync.Mutex
	cli *goredislib.Client
	key string
}

func (h redsyncHeld) write(ctx context.Context, p []byte) error {
	if err := h.cli.Set(ctx, h.key, p, 0).Err(); err != nil {
		return err
	}
	return h.release(ctx)
}

func (h redsyncHeld) release(ctx context.Context) error {
	_, err := h.m.UnlockContext(ctx)
	return err
}

// redislockSystem: Obtain without retries; the write is a SET.
func redislockSystem(cli *goredislib.Client, prefix string) system {
	locker := redislock.New(cli)
	lock := func(ctx context.Context, resource string, ttl time.Duration) (*redislock.Lock, error) {
		l, err := locker.Obtain(ctx, prefix+"redislock:"+resource, ttl, nil)
		if errors.Is(err, redislock.ErrNotObtained) {
			return nil, errBusy
		}
		return l, err
	}
	return system{
		name: "redislock", server: "Redis",
		lock: func(ctx context.Context, resource string) (held, error) {
			l, err := lock(ctx, resource, benchTTL)
			if err != nil {
				return nil, err
			}
			return redislockHeld{l, cli, prefix + "data:" + resource}, nil
		},
		crash: func(ctx context.Context, resource string) (time.Duration, error) {
			const ttl = 50 * time.Millisecond
			start := time.Now()
			if _, err := lock(ctx, resource, ttl); err != nil {
				return 0, err
			}
			return takeOver(ctx, start.Add(ttl), func() (bool, error) {
				b, err := lock(ctx, resource, benchTTL)
				if errors.Is(err, errBusy) {
					return false, nil
				}
				if err == nil {
					err = b.Release(ctx)
				}
				return err == nil, err
			})
		},
		stale: func(ctx context.Context, resource string) (bool, error) {
			const ttl = 50 * time.Millisecond
			if _, err := lock(ctx, resource, ttl); err != nil {
				return false, err
			}
			for {
				b, err := lock(ctx, resource, benchTTL)
				if errors.Is(err, errBusy) {
					time.Sleep(ttl / 10)
					continue
				}
				if err != nil {
					return false, err
				}
				defer func() { _ = b.Release(ctx) }()
				break
			}
			return false, cli.Set(ctx, prefix+"data:"+resource, "stale", 0).Err()
		},
	}
}

type redislockHeld struct {
	l   *redislock.Lock
	cli *goredislib.Client
	key string
}

func (h redislockHeld) write(ctx context.Context, p []byte) error {
	if err := h.cli.Set(ctx, h.key, p, 0).Err(); err != nil {
		return err
	}
	return h.release(ctx)
}

func (h redislockHeld) release(ctx context.Context) error { return h.l.Release(ctx) }

// mutexSystem: concurrency.Mutex.TryLock, with sessions kept in a pool and reused, one per
// lock held at a time, as an application keeps one session per client; the write is a Put.
func mutexSystem(cli *clientv3.Client, prefix string) system {
	sessions := make(chan *concurrency.Session, 64)
	session := func() (*concurrency.Session, error) {
		select {
		case s := <-sessions:
			return s, nil
		default:
			return concurrency.NewSession(cli, concurrency.WithTTL(60))
		}
	}
	putBack := func(s *concurrency.Session) {
		select {
		case sessions <- s:
		default:
			_ = s.Close()
		}
	}
	tryLock := func(ctx context.Context, s *concurrency.Session, resource string) (*concurrency.Mutex, error) {
		m := concurrency.NewMutex(s, prefix+"mutex/"+resource)
		err := m.TryLock(ctx)
		if errors.Is(err, concurrency.ErrLocked) {
			return nil, errBusy
		}
		return m, err
	}
	return system{
		name: "etcd concurrency.Mutex", server: "etcd",
		lock: func(ctx context.Context, resource string) (held, error) {
			s, err := session()
			if err != nil {
				return nil, err
			}
			m, err := tryLock(ctx, s, resource)
			if err != nil {
				putBack(s)
				return nil, err
			}
			return mutexHeld{m, s, cli, prefix + "data/" + resource, putBack}, nil
		},
		crash: func(ctx context.Context, resource string) (time.Duration, error) {
			start := time.Now()
			sa, err := concurrency.NewSession(cli, concurrency.WithTTL(2))
			if err != nil {
				return 0, err
			}
			if _, err := tryLock(ctx, sa, resource); err != nil {
				return 0, err
			}
			sa.Orphan() // the holder dies: no more keepalives
			sb, err := session()
			if err != nil {
				return 0, err
			}
			defer putBack(sb)
			return takeOver(ctx, start.Add(2*time.Second), func() (bool, error) {
				b, err := tryLock(ctx, sb, resource)
				if errors.Is(err, errBusy) {
					return false, nil
				}
				if err == nil {
					err = b.Unlock(ctx)
				}
				return err == nil, err
			})
		},
		stale: func(ctx context.Context, resource string) (bool, error) {
			sa, err := concurrency.NewSession(cli, concurrency.WithTTL(2))
			if err != nil {
				return false, err
			}
			if _, err := tryLock(ctx, sa, resource); err != nil {
				return false, err
			}
			sa.Orphan() // A pauses: no more keepalives; its lease runs out
			sb, err := session()
			if err != nil {
				return false, err
			}
			defer putBack(sb)
			for {
				b, err := tryLock(ctx, sb, resource)
				if errors.Is(err, errBusy) {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				if err != nil {
					return false, err
				}
				defer func() { _ = b.Unlock(ctx) }()
				break
			}
			_, err = cli.Put(ctx, prefix+"data/"+resource, "stale")
			return false, err
		},
	}
}

type mutexHeld struct {
	m       *concurrency.Mutex
	s       *concurrency.Session
	cli     *clientv3.Client
	key     string
	putBack func(*concurrency.Session)
}

func (h mutexHeld) write(ctx context.Context, p []byte) error {
	if _, err := h.cli.Put(ctx, h.key, string(p)); err != nil {
		return err
	}
	return h.release(ctx)
}

func (h mutexHeld) release(ctx context.Context) error {
	err := h.m.Unlock(ctx)
	h.putBack(h.s)
	return err
}

// takeOver tries every millisecond until try succeeds and returns how long after end (the
// holder's TTL counted from the start of its acquisition) that was.
func takeOver(ctx context.Context, end time.Time, try func() (bool, error)) (time.Duration, error) {
	for {
		ok, err := try()
		if err != nil {
			return 0, err
		}
		if ok {
			return time.Since(end), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func freeURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}
