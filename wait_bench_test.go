package fenced

import (
	"context"
	"slices"
	"testing"
	"time"
)

// BenchmarkHandover measures the clean handover on PostgreSQL between two processes (two
// Stores, each with its own pool and listening connection): a waiter blocked in AcquireWait
// on a held resource (its polling an hour long, so only the NOTIFY can wake it), then the
// holder's Release; the time is from the start of Release to the waiter's grant. It reports
// the p50 and p99 of b.N handovers (ns/op is the whole cycle, waiter set-up included), beside
// a baseline in the same run:
//
//	go test -run '^$' -bench Handover -benchtime 500x -count 5 .
func BenchmarkHandover(b *testing.B) {
	url := postgresTestSchema(b)
	holderStore := postgresStore(b, url, nil)
	waiterStore := postgresStore(b, url, &Config{WaitPollMin: time.Hour, WaitPollMax: time.Hour})
	ctx := context.Background()
	if err := holderStore.Provision(ctx, waitResource); err != nil {
		b.Fatal(err)
	}
	if _, err := holderStore.BumpEpoch(ctx); err != nil {
		b.Fatal(err)
	}
	asleep := make(chan struct{}, 1)
	waiterStore.waits.hook = func(event string, _ time.Duration) {
		if event == "sleep" {
			select {
			case asleep <- struct{}{}:
			default:
			}
		}
	}
	// baseline: no waiting at all, the next holder's Acquire sent the moment Release returns
	// (the least a handover can cost: two commits); signal: the waiter in AcquireWait.
	for _, mode := range []string{"baseline", "signal"} {
		b.Run("mode="+mode, func(b *testing.B) { handovers(b, holderStore, waiterStore, asleep, mode == "signal") })
	}
	b.Run("mode=crash", func(b *testing.B) { crashHandovers(b, holderStore, waiterStore) })
}

// crashTTL is the crashed holder's lease in crashHandovers.
const crashTTL = 50 * time.Millisecond

// crashHandovers: the holder takes the lease for crashTTL and vanishes (never releases); a
// waiter of another store, already waiting, gets it. The overshoot reported is the grant's
// time minus (the moment the holder's Acquire was sent + crashTTL): an upper bound on the time
// past the lease's end, since the lease starts after the request was sent.
func crashHandovers(b *testing.B, holderStore, waiterStore *Store) {
	ctx := context.Background()
	over := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		sent := time.Now()
		if _, err := holderStore.Acquire(ctx, waitResource, crashTTL); err != nil {
			b.Fatal(err)
		}
		l, err := waiterStore.AcquireWait(ctx, waitResource, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		over = append(over, time.Since(sent)-crashTTL)
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(over)
	b.ReportMetric(float64(over[len(over)/2].Microseconds()), "p50-overshoot-µs")
	b.ReportMetric(float64(over[len(over)-1].Microseconds()), "max-overshoot-µs")
}

func handovers(b *testing.B, holderStore, waiterStore *Store, asleep chan struct{}, wait bool) {
	ctx := context.Background()
	gaps := make([]time.Duration, 0, b.N)
	granted := make(chan time.Time, 1)
	b.ResetTimer()
	for range b.N {
		holder, err := holderStore.Acquire(ctx, waitResource, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		var l *Lease
		if !wait {
			start := time.Now()
			if err := holder.Release(ctx); err != nil {
				b.Fatal(err)
			}
			if l, err = waiterStore.Acquire(ctx, waitResource, time.Minute); err != nil {
				b.Fatal(err)
			}
			gaps = append(gaps, time.Since(start))
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			continue
		}
		go func() {
			var err error
			l, err = waiterStore.AcquireWait(ctx, waitResource, time.Minute)
			if err != nil {
				b.Error(err)
			}
			granted <- time.Now()
		}()
		<-asleep
		start := time.Now()
		if err := holder.Release(ctx); err != nil {
			b.Fatal(err)
		}
		gaps = append(gaps, (<-granted).Sub(start))
		if l == nil {
			b.FailNow()
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(gaps)
	b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(gaps[len(gaps)*99/100].Microseconds()), "p99-µs")
}
