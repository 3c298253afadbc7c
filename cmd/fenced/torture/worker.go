package torture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// NaiveWrite is a plain lock's write: the payload and published generation stored without any
// condition on the lease, as code trusting "I acquired the lock" would. It exists to show the
// checker failing (fenced torture --unfenced).
type NaiveWrite func(ctx context.Context, lease driver.LeaseRef, payload []byte) error

// WorkerConfig is one worker process's part of the schedule.
type WorkerConfig struct {
	Proc      string   // identity in the history, e.g. "w3"; a replacement gets a new one
	Seed      uint64   // derived from the run's seed and the process's number
	Resources []string // provisioned by the parent
	TTLMin    time.Duration
	TTLMax    time.Duration
	Duration  time.Duration // no new iteration starts after this
	DropReply float64       // probability that an operation's reply is dropped after it ran
	Naive     NaiveWrite    // nil: publish through the fence
	Gate      *GateConfig   // nil: no participating service
	// Phase receives "build RESOURCE GENERATION" before the worker's build pause (the
	// acquisition's RETURN is recorded by then), "call OP" just after each CALL record is
	// written and "held publish RESOURCE GENERATION" when Hold stops the worker, so that the
	// nemesis can aim a pause, a kill or an isolation, and see a lease taken over.
	Phase io.Writer
	// Hold, when set, stops the worker before a publication when the nemesis asks (Hold).
	Hold *Hold
	// Barrier, when set, is held shared by each request from its CALL to its RETURN.
	Barrier *Barrier
	// RenewAlways renews every lease halfway through its build (a mutant test's schedule).
	RenewAlways bool
	// ShortBuilds keeps every build within 3 % of the lease's TTL: no slow build outlives its
	// lease, so that in a control's history the stale writes are those the faults delayed.
	ShortBuilds bool
}

// errDroppedReply is what the drop-reply fault returns in place of the reply it discarded.
var errDroppedReply = errors.New("reply dropped by the torture nemesis after the database ran the statement")

// RunWorker runs the worker loop until cfg.Duration has passed or ctx is done: on a random
// resource, read sometimes, acquire with a short TTL, build (a pause that sometimes outlasts the
// lease, and the nemesis may stretch), sometimes renew, publish a payload naming (worker,
// generation, sequence), release. It never consults the lease's trust window: the database's
// check is what the torture tests. Every driver call is recorded to rec.
func RunWorker(ctx context.Context, cfg WorkerConfig, drv driver.Driver, rec *Recorder) error {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x70727475726521))
	inner := drv
	if cfg.DropReply > 0 {
		inner = &dropper{Driver: drv, rng: rand.New(rand.NewPCG(cfg.Seed, 0x64726f70)), p: cfg.DropReply, rec: rec}
	}
	rd := &recording{Driver: inner, rec: rec, naive: cfg.Naive, phase: cfg.Phase, barrier: cfg.Barrier}
	store, err := fenced.New(ctx, rd, &fenced.Config{SkipMigrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(cfg.Duration)
	seq := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		res := cfg.Resources[rng.IntN(len(cfg.Resources))]
		switch x := rng.Float64(); {
		case x < 0.08:
			_, _ = store.Show(ctx, res)
		case x < 0.16:
			_, _, _ = store.Get(ctx, res)
		}
		ttl := cfg.TTLMin + time.Duration(rng.Int64N(int64(cfg.TTLMax-cfg.TTLMin)+1))
		ttl = ttl.Round(time.Millisecond)
		lease, err := store.Acquire(ctx, res, ttl)
		if err != nil {
			sleep(ctx, time.Duration(1+rng.IntN(10))*time.Millisecond)
			continue
		}
		if !gateFence(ctx, cfg.Gate, rd, lease) {
			_ = lease.Release(ctx)
			continue
		}
		// The build: usually short (the workers spend their time on requests, not asleep),
		// sometimes a good part of the lease, sometimes past it (a slow build: the stale
		// writes the fence is for); the nemesis aims its pauses here.
		build := time.Duration(float64(ttl) * 0.03 * rng.Float64())
		switch x := rng.Float64(); {
		case cfg.ShortBuilds:
		case x < 0.06:
			build = time.Duration(float64(ttl) * (1.1 + 0.5*rng.Float64()))
		case x < 0.16:
			build = time.Duration(float64(ttl) * (0.1 + 0.5*rng.Float64()))
		}
		renew := rng.Float64() < 0.2 || cfg.RenewAlways
		together := cfg.Naive == nil && rng.Float64() < 0.5
		if cfg.Phase != nil {
			_, _ = fmt.Fprintf(cfg.Phase, "build %s %d\n", res, lease.Generation())
		}
		sleep(ctx, build/2)
		if renew {
			_ = lease.Renew(ctx, ttl)
		}
		sleep(ctx, build-build/2)
		seq++
		payload := fmt.Appendf(nil, `{"worker":%q,"generation":%d,"seq":%d}`, cfg.Proc, lease.Generation(), seq)
		gateWrite(ctx, cfg.Gate, rd, lease, payload)
		cfg.Hold.at(ctx, cfg.Phase, res, lease.Generation())
		if together {
			_ = lease.PublishAndRelease(ctx, payload)
			continue
		}
		_ = lease.Publish(ctx, payload)
		_ = lease.Release(ctx)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// recording writes a CALL record before each request and a RETURN record after its reply. A
// driver error is recorded as an unknown outcome: the statement may or may not have run. Not
// safe for concurrent use: a worker runs one operation at a time.
type recording struct {
	driver.Driver
	rec     *Recorder
	naive   NaiveWrite
	phase   io.Writer
	barrier *Barrier
}

// call waits at the barrier, if any, and records the CALL; on error nothing is held.
func (d *recording) call(r Record) (int64, error) {
	if d.barrier != nil {
		if err := d.barrier.Enter(); err != nil {
			return 0, err
		}
	}
	id, err := d.rec.Call(r)
	if err != nil {
		d.leave()
		return 0, err
	}
	if d.phase != nil {
		_, _ = io.WriteString(d.phase, "call "+r.Op+"\n")
	}
	return id, nil
}

func (d *recording) leave() {
	if d.barrier != nil {
		d.barrier.Leave()
	}
}

// ret records the reply and passes err on. An error is an unknown outcome unless r already
// says what the error meant (busy, not found) or the driver proves it was not applied.
func (d *recording) ret(id int64, r Record, err error) error {
	r.Kind, r.ID = KindReturn, id
	switch {
	case err != nil && r.Out == "" && errors.Is(err, driver.ErrNotApplied):
		r.Out, r.Err = OutFailed, err.Error()
	case err != nil && r.Out == "":
		r.Out, r.Err = OutUnknown, err.Error()
	}
	werr := d.rec.Write(r)
	d.leave()
	if werr != nil && err == nil {
		return werr
	}
	return err
}

func refusedOr(ok bool) string {
	if ok {
		return OutOK
	}
	return OutRefused
}

func (d *recording) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	id, err := d.call(Record{Op: OpAcquire, Resource: resource, Owner: owner, TTLMs: ttl.Milliseconds()})
	if err != nil {
		return driver.Grant{}, err
	}
	g, err := d.Driver.Acquire(ctx, resource, owner, ttl)
	var busy *driver.BusyError
	switch {
	case errors.As(err, &busy):
		return g, d.ret(id, Record{Out: OutBusy, Gen: busy.Generation, LeaseUntilUs: micros(busy.LeaseUntil)}, err)
	case errors.Is(err, driver.ErrNotFound):
		return g, d.ret(id, Record{Out: OutNotFound}, err)
	case err != nil:
		return g, d.ret(id, Record{}, err)
	}
	return g, d.ret(id, Record{Out: OutOK, Epoch: g.Epoch, Gen: g.Generation, LeaseUntilUs: micros(g.LeaseUntil)}, nil)
}

func (d *recording) lease(op string, l driver.LeaseRef, payload []byte) (int64, error) {
	return d.call(Record{Op: op, Resource: l.Resource, Owner: l.Owner, Epoch: l.Epoch, Gen: l.Generation, Payload: string(payload)})
}

func (d *recording) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	id, err := d.call(Record{Op: OpRenew, Resource: l.Resource, Owner: l.Owner, Epoch: l.Epoch, Gen: l.Generation, TTLMs: ttl.Milliseconds()})
	if err != nil {
		return time.Time{}, false, err
	}
	until, ok, err := d.Driver.Renew(ctx, l, ttl)
	r := Record{Out: outcome(ok, err)}
	if ok && err == nil {
		r.LeaseUntilUs = micros(until)
	}
	return until, ok, d.ret(id, r, err)
}

func (d *recording) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	id, err := d.lease(OpPublish, l, pub.Payload)
	if err != nil {
		return false, err
	}
	var ok bool
	if d.naive != nil {
		ok, err = true, d.naive(ctx, l, pub.Payload)
	} else {
		ok, err = d.Driver.Publish(ctx, l, pub)
	}
	return ok, d.ret(id, Record{Out: outcome(ok, err)}, err)
}

func (d *recording) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	id, err := d.lease(OpPublishRelease, l, pub.Payload)
	if err != nil {
		return false, err
	}
	ok, err := d.Driver.PublishAndRelease(ctx, l, pub)
	return ok, d.ret(id, Record{Out: outcome(ok, err)}, err)
}

func (d *recording) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	id, err := d.lease(OpRelease, l, nil)
	if err != nil {
		return false, err
	}
	ok, err := d.Driver.Release(ctx, l)
	return ok, d.ret(id, Record{Out: outcome(ok, err)}, err)
}

func (d *recording) Read(ctx context.Context, resource string) (driver.State, error) {
	id, err := d.call(Record{Op: OpShow, Resource: resource})
	if err != nil {
		return driver.State{}, err
	}
	st, err := d.Driver.Read(ctx, resource)
	r := Record{Out: OutOK, Gen: st.Generation, ReadOwner: st.Owner, ReadPub: st.PublishedGeneration, PayloadBytes: st.PayloadSize,
		LeaseUntilUs: micros(st.LeaseUntil), NowUs: micros(st.Now), StoreEpoch: st.CurrentEpoch}
	switch {
	case errors.Is(err, driver.ErrNotFound):
		r = Record{Out: OutNotFound}
	case err != nil:
		r = Record{}
	}
	return st, d.ret(id, r, err)
}

func (d *recording) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	id, err := d.call(Record{Op: OpGet, Resource: resource})
	if err != nil {
		return nil, 0, err
	}
	payload, gen, err := d.Driver.ReadPayload(ctx, resource)
	r := Record{Out: OutOK, ReadPub: gen, Payload: string(payload)}
	switch {
	case errors.Is(err, driver.ErrNotFound):
		r = Record{Out: OutNotFound} // not provisioned: the model allows no such answer
	case err != nil:
		r = Record{}
	case gen == 0:
		r = Record{Out: OutNotFound}
	}
	return payload, gen, d.ret(id, r, err)
}

// micros is an engine time as recorded: microseconds since 1970, 0 for none.
func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// outcome is a lease operation's recorded outcome; an error leaves it to ret (unknown).
func outcome(ok bool, err error) string {
	if err != nil {
		return ""
	}
	return refusedOr(ok)
}

// dropper is the drop-reply fault: it runs the real operation and then, when the seeded draw
// says so, throws the reply away and returns an error, as a connection lost after the commit
// would. The true result is written to the history as a note for the report; the checker
// never reads it, but the note bounds the operation's interval (history.go), so it is written
// only for a definite answer. Not safe for concurrent use.
type dropper struct {
	driver.Driver
	rng *rand.Rand
	p   float64
	rec *Recorder
}

// drop draws whether to throw away the reply to op, whose call returned err, and notes the
// true result when it does. A call that failed without the database's answer (a reset, a
// timeout) has no reply to throw away: its effect may still land after the RETURN, so it is
// left an ordinary unknown outcome, open to the end of the history. The draw is made either
// way, so that the seed's sequence of draws does not depend on the network.
func (d *dropper) drop(op string, err error, result string) bool {
	if d.rng.Float64() >= d.p || !definite(err) {
		return false
	}
	_ = d.rec.Write(Record{Kind: KindNote, ID: d.rec.current(), Event: "drop",
		Detail: fmt.Sprintf("%s reply dropped; the database had answered %s", op, result)})
	return true
}

func (d *dropper) Acquire(ctx context.Context, resource, owner string, ttl time.Duration) (driver.Grant, error) {
	g, err := d.Driver.Acquire(ctx, resource, owner, ttl)
	if d.drop(OpAcquire, err, describe(true, err, fmt.Sprintf("generation %d", g.Generation))) {
		return driver.Grant{}, errDroppedReply
	}
	return g, err
}

func (d *dropper) Renew(ctx context.Context, l driver.LeaseRef, ttl time.Duration) (time.Time, bool, error) {
	until, ok, err := d.Driver.Renew(ctx, l, ttl)
	if d.drop(OpRenew, err, describe(ok, err, "")) {
		return time.Time{}, false, errDroppedReply
	}
	return until, ok, err
}

func (d *dropper) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	ok, err := d.Driver.Publish(ctx, l, pub)
	if d.drop(OpPublish, err, describe(ok, err, "")) {
		return false, errDroppedReply
	}
	return ok, err
}

func (d *dropper) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	ok, err := d.Driver.PublishAndRelease(ctx, l, pub)
	if d.drop(OpPublishRelease, err, describe(ok, err, "")) {
		return false, errDroppedReply
	}
	return ok, err
}

func (d *dropper) Release(ctx context.Context, l driver.LeaseRef) (bool, error) {
	ok, err := d.Driver.Release(ctx, l)
	if d.drop(OpRelease, err, describe(ok, err, "")) {
		return false, errDroppedReply
	}
	return ok, err
}

// definite reports whether a lease operation's err is the database's answer: none (accepted or
// refused), busy, not provisioned, or proven not applied.
func definite(err error) bool {
	var busy *driver.BusyError
	return err == nil || errors.As(err, &busy) || errors.Is(err, driver.ErrNotFound) || errors.Is(err, driver.ErrNotApplied)
}

func describe(ok bool, err error, detail string) string {
	switch {
	case err != nil:
		return "error: " + err.Error()
	case !ok:
		return "refused"
	case detail != "":
		return "ok, " + detail
	}
	return "ok"
}

// RunReader reads the resources (show and get, alternately, on a seeded choice) every interval
// until ctx is done, recording each read: a reader that is not a worker, so that reads are
// spread over the whole run.
func RunReader(ctx context.Context, drv driver.Driver, rec *Recorder, barrier *Barrier, resources []string, seed uint64, interval time.Duration) {
	rng := rand.New(rand.NewPCG(seed, 0x726561646572))
	rd := &recording{Driver: drv, rec: rec, barrier: barrier}
	for ctx.Err() == nil {
		res := resources[rng.IntN(len(resources))]
		if rng.IntN(2) == 0 {
			_, _ = rd.Read(ctx, res)
		} else {
			_, _, _ = rd.ReadPayload(ctx, res)
		}
		sleep(ctx, interval)
	}
}

// ReadAll records one show and one get of every resource: the final state.
func ReadAll(ctx context.Context, drv driver.Driver, rec *Recorder, resources []string) {
	rd := &recording{Driver: drv, rec: rec}
	for _, res := range resources {
		_, _ = rd.Read(ctx, res)
		_, _, _ = rd.ReadPayload(ctx, res)
	}
}
