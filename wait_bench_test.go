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
// the p50 and p99 of b.N handovers (ns/op is the whole cycle, waiter set-up included):
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
	gaps := make([]time.Duration, 0, b.N)
	granted := make(chan time.Time, 1)
	b.ResetTimer()
	for range b.N {
		holder, err := holderStore.Acquire(ctx, waitResource, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		var l *Lease
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
