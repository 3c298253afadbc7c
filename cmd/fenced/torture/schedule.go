package torture

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Fault kinds. drop-reply is injected inside the workers; the others by the parent.
const (
	FaultPause     = "pause"
	FaultKill      = "kill"
	FaultDropReply = "drop-reply"
	FaultRestart   = "restart"
	FaultClock     = "clock"
	// FaultRowLock holds a leased resource's row lock until after the lease has expired, so
	// that a renewal or a publication of that lease waits on it across the expiry.
	FaultRowLock = "rowlock"
	// FaultBump runs the epoch bump (fenced epoch bump) while the workers run.
	FaultBump = "bump"
	// FaultRestore copies the store (the torture's resources and the epoch) with the workers
	// held at a barrier, lets the run go on, then restores the copy and bumps the epoch, again at
	// the barrier, as an operator restoring a backup with the application stopped would.
	FaultRestore = "restore"
	// FaultPartition cuts the network between the workers and the database server: the host
	// side of a veth pair to the server's network namespace is set down, then up again.
	FaultPartition = "partition"
	// FaultLoss drops a share of the packets on the same interface, at random, each way (an
	// nftables rule on the device: real loss, which TCP retransmits, where tc netem is missing).
	FaultLoss = "loss"
	// FaultDelay puts a TCP proxy of the run's own (Proxy) between the workers and the
	// database server, and makes it delay bytes with jitter, stall connections for longer
	// than a TTL, or reset them: delays and loss without tc netem.
	FaultDelay = "delay"
	// FaultIsolate cuts one worker, or a minority of them, off from the database server for
	// longer than any TTL, then heals the link: each worker it can cut runs in a network
	// namespace of its own, and the host side of its veth pair is set down, while the other
	// workers keep working.
	FaultIsolate = "isolate"
)

// The delay fault's modes.
const (
	DelayLatency = "latency" // every byte late by a base latency ± jitter, for a while
	DelayStall   = "stall"   // about half the connections pass nothing for longer than a TTL
	DelayReset   = "reset"   // about half the connections reset (RST) at once
)

// AllFaults is every fault kind, in the order the help lists them.
var AllFaults = []string{FaultPause, FaultKill, FaultDropReply, FaultRestart, FaultClock, FaultRowLock, FaultBump, FaultRestore, FaultPartition, FaultLoss, FaultDelay, FaultIsolate}

// The workers' part of the schedule.
const (
	TTLMin    = 300 * time.Millisecond
	TTLMax    = 800 * time.Millisecond
	DropReply = 0.03 // probability per operation, when drop-reply is on
)

// ParseFaults reads a comma-separated list of fault kinds; "none" alone is the empty list.
func ParseFaults(list string) ([]string, error) {
	if strings.TrimSpace(list) == "none" {
		return nil, nil
	}
	var out []string
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(AllFaults, f) {
			return nil, fmt.Errorf("unknown fault %q; use %s", f, strings.Join(AllFaults, ", "))
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q names no fault; use %s, or none", list, strings.Join(AllFaults, ", "))
	}
	return out, nil
}

// Fault is one planned nemesis action.
type Fault struct {
	At       time.Duration // from the start of the run
	Kind     string
	Slot     int           // the worker slot (pause, kill)
	For      time.Duration // how long a pause lasts
	OffsetMs int64         // clock: the database clock's offset from now on
	Rollback bool          // rowlock: update the row and roll back, rather than only lock it
	After    time.Duration // restore: how long after the copy it is restored
	Mode     string        // delay: DelayLatency, DelayStall or DelayReset
	Latency  time.Duration // delay (latency): the base latency of every byte, each way
	Jitter   time.Duration // delay (latency): ± this, drawn per chunk
	LossPct  int           // loss: the percentage of packets dropped, each way
	Count    int           // isolate: how many workers are cut off, from Slot on
}

func (f Fault) String() string {
	switch f.Kind {
	case FaultPause:
		return fmt.Sprintf("%6.2fs pause worker slot %d for %s", f.At.Seconds(), f.Slot, f.For)
	case FaultKill:
		return fmt.Sprintf("%6.2fs kill -9 worker slot %d during an operation", f.At.Seconds(), f.Slot)
	case FaultClock:
		return fmt.Sprintf("%6.2fs database clock offset → %+dms", f.At.Seconds(), f.OffsetMs)
	case FaultRowLock:
		how := "lock"
		if f.Rollback {
			how = "update (rolled back)"
		}
		return fmt.Sprintf("%6.2fs %s the row of resource slot %d across its lease's expiry", f.At.Seconds(), how, f.Slot)
	case FaultRestore:
		return fmt.Sprintf("%6.2fs copy the store, restore it %s later", f.At.Seconds(), f.After)
	case FaultBump:
		return fmt.Sprintf("%6.2fs bump the epoch", f.At.Seconds())
	case FaultPartition:
		return fmt.Sprintf("%6.2fs cut the network to the server for %s", f.At.Seconds(), f.For)
	case FaultIsolate:
		return fmt.Sprintf("%6.2fs cut %d worker(s) from slot %d off from the server for %s", f.At.Seconds(), f.Count, f.Slot, f.For)
	case FaultLoss:
		return fmt.Sprintf("%6.2fs drop %d%% of the packets to and from the server for %s", f.At.Seconds(), f.LossPct, f.For)
	case FaultDelay:
		switch f.Mode {
		case DelayLatency:
			return fmt.Sprintf("%6.2fs delay the bytes to and from the server by %s ± %s for %s", f.At.Seconds(), f.Latency, f.Jitter, f.For)
		case DelayStall:
			return fmt.Sprintf("%6.2fs stall about half the connections to the server for %s", f.At.Seconds(), f.For)
		}
		return fmt.Sprintf("%6.2fs reset about half the connections to the server", f.At.Seconds())
	}
	return fmt.Sprintf("%6.2fs %s", f.At.Seconds(), f.Kind)
}

// Plan derives the nemesis's schedule from the seed: the same seed, duration, worker count and
// fault list give the same plan. Only the parent's faults are planned (drop-reply is drawn by
// each worker from its own seed). Faults run one after another, a pause always longer than
// the longest TTL. Each fault asked for comes once, in a seeded order, before any comes twice,
// so that a short run injects every one that fits.
func Plan(seed uint64, duration time.Duration, workers int, faults []string) []Fault {
	rng := rand.New(rand.NewPCG(seed, 0x6e656d65736973))
	var kinds, first []string
	weights := map[string]int{FaultPause: 4, FaultKill: 3, FaultClock: 2, FaultRestart: 1, FaultRowLock: 2, FaultBump: 1, FaultRestore: 2, FaultPartition: 2, FaultLoss: 2, FaultDelay: 3, FaultIsolate: 3}
	for _, f := range faults {
		for range weights[f] {
			kinds = append(kinds, f)
		}
		if weights[f] > 0 {
			first = append(first, f)
		}
	}
	rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	if len(kinds) == 0 || workers < 1 {
		return nil
	}
	var (
		plan        []Fault
		offset      int64
		lastRestart = -time.Hour
	)
	at := time.Second + time.Duration(rng.Int64N(int64(time.Second)))
	for at < duration-2*time.Second {
		kind := kinds[rng.IntN(len(kinds))]
		if len(first) > 0 {
			kind, first = first[0], first[1:]
		}
		f := Fault{At: at, Kind: kind, Slot: rng.IntN(workers)}
		busy := time.Duration(0)
		switch f.Kind {
		case FaultPause:
			f.For = TTLMax + 200*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
			busy = f.For
		case FaultKill:
			busy = 300 * time.Millisecond
		case FaultClock:
			// Jump away from the true clock, then back to it: forward makes leases expire
			// early, backward keeps them alive longer.
			if offset == 0 {
				jump := int64(TTLMax/time.Millisecond) + rng.Int64N(2000)
				if rng.Float64() < 0.4 {
					jump = -jump
				}
				offset = jump
			} else {
				offset = 0
			}
			f.OffsetMs = offset
		case FaultRowLock:
			// Up to 2s waiting for a live lease, then held past its expiry (at most TTLMax).
			f.Rollback = rng.Float64() < 0.5
			busy = 2*time.Second + TTLMax
		case FaultBump:
			busy = 200 * time.Millisecond
		case FaultPartition:
			// Longer than the longest TTL: leases expire on the server while their holders
			// cannot reach it.
			f.For = TTLMax + 200*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second)))
			busy = f.For
		case FaultIsolate:
			// Longer than the longest TTL, as a partition; one worker, or now and then a
			// minority of them, so that the others take over the leases it holds.
			f.For = TTLMax + 200*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second)))
			f.Count = 1
			if minority := (workers - 1) / 2; minority > 1 && rng.Float64() < 0.3 {
				f.Count = 1 + rng.IntN(minority)
			}
			busy = f.For
		case FaultLoss:
			// From a nuisance to most packets: TCP's retransmissions (200 ms, then doubling)
			// make a request late by more than a TTL now and then.
			f.LossPct = 5 + rng.IntN(56)
			f.For = time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
			busy = f.For
		case FaultDelay:
			switch x := rng.Float64(); {
			case x < 0.45:
				// Up to a third of the longest TTL each way, so that a request and its
				// reply can take most of a short lease.
				f.Mode = DelayLatency
				f.Latency = time.Duration(5+rng.Int64N(250)) * time.Millisecond
				f.Jitter = time.Duration(rng.Int64N(int64(f.Latency/time.Millisecond)+1)) * time.Millisecond
				f.For = time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
			case x < 0.8:
				// Longer than the longest TTL: what a lost segment retransmitted late is,
				// made long enough that the lease expires while its request is held.
				f.Mode = DelayStall
				f.For = TTLMax + 200*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
			default:
				f.Mode = DelayReset
			}
			busy = f.For
		case FaultRestore:
			// The copy, then the workers go on for a few seconds (several generations per
			// resource) before it is restored; nothing else runs meanwhile, so that the
			// restore is what rolls the store back.
			f.After = 2*time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
			if at+f.After > duration-time.Second {
				at += time.Second
				continue
			}
			busy = f.After + 500*time.Millisecond
		case FaultRestart:
			if at-lastRestart < 8*time.Second { // restarts are heavy: at most one per 8s
				at += time.Second
				continue
			}
			lastRestart = at
			busy = 3 * time.Second
		}
		plan = append(plan, f)
		at += busy + 500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
	}
	return plan
}

// WorkerSeed is the seed of the n-th worker process started (1-based, replacements included).
func WorkerSeed(seed uint64, n int) uint64 {
	z := seed + uint64(n)*0x9e3779b97f4a7c15 // splitmix64
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
