package fenced_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/sqlite"
)

// model is the protocol's row as a plain value: what every sequence of operations must leave
// in the database.
type model struct {
	gen, published int64
	holder         int // actor holding the current generation, -1 when free
	expired        bool
	payload        []byte
}

// FuzzProtocolSequence drives three actors through random sequences of operations against
// SQLite and checks every answer and the row after every step against the model.
func FuzzProtocolSequence(f *testing.F) {
	f.Add([]byte{0, 10, 3, 11, 1, 12, 5})
	f.Add([]byte{0, 4, 5, 1, 2, 3, 6, 7, 8})
	f.Add([]byte{0, 9, 1, 13, 2, 14, 4, 12, 0, 8})
	f.Add([]byte{0, 15, 3, 0, 11, 5, 1, 7, 12, 2})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		ctx := context.Background()
		drv, err := sqlite.Open(filepath.Join(t.TempDir(), "f.db"))
		if err != nil {
			t.Fatal(err)
		}
		store, err := fenced.New(ctx, drv, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		if err := store.Provision(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		m := model{holder: -1}
		leases := make([]*fenced.Lease, 3)
		for step, op := range ops {
			actor := int(op % 3)
			l := leases[actor]
			payload := []byte(fmt.Sprintf("step %d by %d", step, actor))
			current := l != nil && l.Generation() == m.gen && m.holder == actor
			switch (op / 3) % 6 {
			case 0: // acquire
				nl, err := store.Acquire(ctx, "r", time.Minute)
				if m.holder >= 0 && !m.expired {
					if !errors.Is(err, fenced.ErrBusy) {
						t.Fatalf("step %d: acquire of a held lease: %v", step, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: acquire: %v", step, err)
				}
				m.gen++
				m.holder, m.expired = actor, false
				if nl.Generation() != m.gen {
					t.Fatalf("step %d: generation %d, want %d", step, nl.Generation(), m.gen)
				}
				leases[actor] = nl
			case 1, 2: // publish, publish and release
				if l == nil {
					continue
				}
				release := (op/3)%6 == 2
				if release {
					err = l.PublishAndRelease(ctx, payload)
				} else {
					err = l.Publish(ctx, payload)
				}
				if current && !m.expired && m.published < l.Generation() {
					if err != nil {
						t.Fatalf("step %d: publish by the current holder: %v", step, err)
					}
					m.published, m.payload = l.Generation(), payload
					if release {
						m.holder = -1
					}
				} else if !errors.Is(err, fenced.ErrRefused) {
					t.Fatalf("step %d: publish with a lease that is not current: %v", step, err)
				}
			case 3: // renew
				if l == nil {
					continue
				}
				err = l.Renew(ctx, time.Minute)
				if current && !m.expired {
					if err != nil {
						t.Fatalf("step %d: renew by the current holder: %v", step, err)
					}
				} else if !errors.Is(err, fenced.ErrRefused) {
					t.Fatalf("step %d: renew of a lease that is not current: %v", step, err)
				}
			case 4: // release
				if l == nil {
					continue
				}
				err = l.Release(ctx)
				if current {
					if err != nil {
						t.Fatalf("step %d: release by the holder: %v", step, err)
					}
					m.holder, m.expired = -1, false
				} else if !errors.Is(err, fenced.ErrRefused) {
					t.Fatalf("step %d: release of a lease that is not current: %v", step, err)
				}
			case 5: // the lease runs out
				if _, err := drv.DB().ExecContext(ctx, `UPDATE fenced_resources
					SET lease_until = CAST(unixepoch('subsec') * 1000000 AS INTEGER) - 1000000
					WHERE lease_until IS NOT NULL`); err != nil {
					t.Fatal(err)
				}
				if m.holder >= 0 {
					m.expired = true
				}
			}
			st, err := store.Show(ctx, "r")
			if err != nil {
				t.Fatal(err)
			}
			if st.Generation != m.gen || st.PublishedGeneration != m.published || st.Held() != (m.holder >= 0 && !m.expired) {
				t.Fatalf("step %d: row %+v, model %+v", step, st, m)
			}
			if m.published > 0 {
				got, gen, err := store.Get(ctx, "r")
				if err != nil || gen != m.published || !bytes.Equal(got, m.payload) {
					t.Fatalf("step %d: get = %q@%d, %v; model %q@%d", step, got, gen, err, m.payload, m.published)
				}
			}
		}
	})
}
