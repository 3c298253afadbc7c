package torture

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Operation kinds, as recorded.
const (
	OpAcquire        = "acquire"
	OpRenew          = "renew"
	OpPublish        = "publish"
	OpPublishRelease = "publish_release"
	OpRelease        = "release"
	OpShow           = "show"
	OpGet            = "get"
	// The nemesis's operations, one per resource, so that the model sees them: a copy taken
	// (it must match a state the resource was in), the copy restored (a legitimate rollback to
	// that state) and the epoch bumped (every lease freed, a larger epoch).
	OpSnapshot = "snapshot"
	OpRestore  = "restore"
	OpBump     = "bump"
	// OpSelfBump is not recorded: the checker adds one per resource for each restart after
	// which the engine bumps its epoch by itself (Record.SelfBump), so that the model knows
	// the leases held across the restart were freed (see selfBumps in check.go).
	OpSelfBump = "self_bump"
)

// Outcomes, as recorded. Anything that is not a definite answer is OutUnknown.
const (
	OutOK       = "ok"
	OutBusy     = "busy"
	OutRefused  = "refused"
	OutNotFound = "notfound" // not provisioned, or (get) nothing published
	OutFailed   = "failed"   // an error the driver proves left nothing changed (driver.ErrNotApplied)
	OutUnknown  = "unknown"
)

// Record kinds.
const (
	KindCall   = "call"
	KindReturn = "return"
	KindNote   = "note"  // a worker's remark (a dropped reply's true result); never checked
	KindEvent  = "event" // a nemesis or process event written by the parent
)

// Record is one line of a history file.
type Record struct {
	Kind string `json:"k"`
	Proc string `json:"p"`
	ID   int64  `json:"id,omitempty"` // operation number within Proc
	Time int64  `json:"t"`            // CLOCK_MONOTONIC, nanoseconds

	// call
	Op       string `json:"op,omitempty"`
	Resource string `json:"r,omitempty"`
	Owner    string `json:"owner,omitempty"`
	Epoch    int64  `json:"epoch,omitempty"` // the lease's epoch (call) or the grant's (return)
	Gen      int64  `json:"gen,omitempty"`   // the lease's generation (call) or the result's (return)
	TTLMs    int64  `json:"ttl_ms,omitempty"`
	Payload  string `json:"payload,omitempty"` // published (call) or read (get's return)

	// return
	Out          string `json:"out,omitempty"`
	Err          string `json:"err,omitempty"`
	ReadOwner    string `json:"read_owner,omitempty"`
	ReadPub      int64  `json:"read_pub,omitempty"`
	PayloadBytes int64  `json:"payload_bytes,omitempty"`

	// note and event
	Event   string `json:"event,omitempty"` // pause, resume, kill, start, exit, restart, clock, drop
	Slot    int    `json:"slot,omitempty"`
	Pid     int    `json:"pid,omitempty"`
	EndTime int64  `json:"end,omitempty"` // when the event ended (pause, restart)
	// SelfBump (restart) says that the engine bumps its epoch by itself after this restart, at
	// its first lease-carrying request (Redis: the server's run id changed), which frees every
	// lease held across it.
	SelfBump bool  `json:"self_bump,omitempty"`
	OffsetMs int64 `json:"offset_ms,omitempty"`
	// Until (rowlock) is when the lease of (Owner, Epoch, Gen) on Resource expires at the
	// latest, on this clock: the database's remaining time read under the lock, added to the
	// moment that read returned.
	Until  int64  `json:"until,omitempty"`
	Detail string `json:"detail,omitempty"`

	// The engine's clock, in microseconds since 1970, as the reply carried it: the lease's
	// expiry (acquire, renew; for busy, the holder's), the engine's now (show).
	LeaseUntilUs int64 `json:"lease_until_us,omitempty"`
	NowUs        int64 `json:"now_us,omitempty"`
	// StoreEpoch is the store's epoch: read by show, or held by a snapshot (return).
	StoreEpoch int64 `json:"store_epoch,omitempty"`
}

// Now is CLOCK_MONOTONIC in nanoseconds: the system-wide monotonic clock, comparable between
// processes on one host (Go's own monotonic reading is relative to each process's start).
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err)) // cannot fail on Linux
	}
	return ts.Nano()
}

// Recorder appends records to one history file. Each record is one write(2) on an O_APPEND
// file, with no buffering in this process, so that a record written before a request was sent
// survives the process being killed while it waits. It is safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	f       *os.File
	proc    string
	next    int64
	noClock bool
}

// WithoutEngineClock makes the recorder leave the engine's clock out of every record: for an
// engine whose replies carry no clock of its own (etcd: a lease's expiry there is the client's
// clock plus the etcd lease's TTL in whole seconds), so that the clock checks are not fed
// times that mean something else.
func (w *Recorder) WithoutEngineClock() {
	w.mu.Lock()
	w.noClock = true
	w.mu.Unlock()
}

// NewRecorder creates (or appends to) the history file at path for process proc.
func NewRecorder(path, proc string) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open history: %w", err)
	}
	return &Recorder{f: f, proc: proc}, nil
}

// Write stamps r with the recorder's process (unless r names one: an event about a worker)
// and, when it has none, the current time, and appends it.
func (w *Recorder) Write(r Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.Proc == "" {
		r.Proc = w.proc
	}
	if r.Time == 0 {
		r.Time = Now()
	}
	if w.noClock {
		r.LeaseUntilUs, r.NowUs = 0, 0
	}
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode history record: %w", err)
	}
	if _, err := w.f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("write history: %w", err)
	}
	return nil
}

// Call records the start of an operation and returns its number. The time is taken last, so
// that it is as close as possible to the request.
func (w *Recorder) Call(r Record) (int64, error) {
	w.mu.Lock()
	w.next++
	id := w.next
	w.mu.Unlock()
	r.Kind, r.ID, r.Time = KindCall, id, 0
	return id, w.Write(r)
}

// current is the number of the latest call, for a note about it.
func (w *Recorder) current() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

// Close closes the file.
func (w *Recorder) Close() error { return w.f.Close() }

// Op is one operation of the merged history. Return is End (the end of the history) when the
// outcome is unknown and the request may still take effect (a killed worker, a driver error);
// a reply dropped by the drop-reply fault keeps its recorded Return.
//
// The fields every check reads come first, in the object's first 64 bytes (one cache line):
// at a million operations the checks' passes read them from memory, not from the caches.
type Op struct {
	Kind   string // one of the Op constants: Build makes it the constant itself, not a copy
	Out    string // one of the Out constants, likewise
	Call   int64
	Return int64
	Epoch  int64 // the lease's epoch; for an acquisition, the one granted
	Gen    int64 // the lease's generation; for an acquisition, the one granted

	Index int // position in History.Ops
	// OwnerN and ReadOwnerN number Owner and ReadOwner in History.Owners (0: none), and ResN
	// Resource in History.Resources(), so that the checks index slices instead of hashing the
	// strings. Build sets them; an Op made otherwise has them 0 (History.Owners nil).
	OwnerN, ReadOwnerN, ResN int32
	kind                     opKind    // Kind's code, likewise
	out                      opOutcome // Out's code
	returned                 bool      // a RETURN record was paired with the CALL (Build); beside kind and out, it costs no space
	procN                    int32     // Proc's number, in the order the records first name it

	Proc     string
	ID       int64
	Resource string
	Owner    string
	TTLMs    int64
	Payload  string // published, or read by get
	Err      string
	// Reads.
	ReadGen      int64
	ReadOwner    string
	ReadPub      int64
	PayloadBytes int64
	Note         string // a dropped reply's true result, for the report only
	// The engine's clock (µs since 1970) from the reply, 0 when it carried none: the lease's
	// expiry (acquire, renew; busy: the holder's; show: the row's), the engine's now (show).
	LeaseUntilUs int64
	NowUs        int64
	StoreEpoch   int64 // show: the store's epoch; snapshot, restore: the copy's
}

// Unknown reports whether the operation may or may not have taken effect.
func (o *Op) Unknown() bool { return o.Out == OutUnknown }

// Write reports whether the operation carries a lease.
func (o *Op) Write() bool { return kindOf(o.Kind).write() }

// Read reports whether the operation reads the row.
func (o *Op) Read() bool { return o.Kind == OpShow || o.Kind == OpGet }

// History is every process's operations, sorted by call time, and the nemesis's events.
type History struct {
	Ops    []*Op
	Events []Record
	Start  int64 // the earliest time in the history
	End    int64 // later than every time in the history: the return time of unknown outcomes
	// Truncated counts lines that could not be decoded (a record cut by a crash).
	Truncated int
	// Owners lists the owners named by the operations (Owner, ReadOwner), Owners[0] being "":
	// Op.OwnerN and Op.ReadOwnerN index it. resources is Resources(), which Op.ResN indexes.
	Owners    []string
	resources []string
}

// Load reads every *.jsonl file in dir.
func Load(dir string) (*History, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	var recs []Record
	h := &History{}
	for _, f := range files {
		rs, bad, err := readFile(f)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rs...)
		h.Truncated += bad
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("load history: no *.jsonl files in %s: %w", dir, fs.ErrNotExist)
	}
	return Build(recs, h.Truncated), nil
}

func readFile(path string) ([]Record, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("read history: %w", err)
	}
	defer f.Close()
	var (
		out []Record
		bad int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			bad++
			continue
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("read history %s: %w", path, err)
	}
	return out, bad, nil
}

// Build pairs calls with returns. It is exported for tests that write histories by hand.
//
// Its work is in proportion to the history (issue 13), though its cost per operation still
// rises once the Ops outgrow the caches (docs/TORTURE.md): the operations are one slice of
// Ops (no heap object per operation), grouped by resource so that each resource's checks
// read memory in order, a call's return is found by process number and operation number in a slice per
// process (Recorder numbers each process's calls 1, 2, 3...) instead of a map of strings, and
// the strings an operation shares with others (process, resource, owner) point to one copy
// each, so that the collector marks a handful of objects where it marked one per operation.
func Build(recs []Record, truncated int) *History {
	h := &History{Truncated: truncated, Start: math.MaxInt64}
	var (
		maxTime int64
		procs   pairing
		calls   = make([]called, 0, len(recs)/2+1) // sized for the usual shape, a call and its return
		sorted  = true
		owners  int // the calls that may name a new owner: acquisitions, mostly
	)
	for i := range recs {
		r := &recs[i]
		h.Start = min(h.Start, r.Time)
		maxTime = max(maxTime, r.Time, r.EndTime)
		switch r.Kind {
		case KindCall:
			if n := len(calls); n > 0 && r.Time < calls[n-1].t {
				sorted = false
			}
			if r.Owner != "" && r.Op != OpRenew && r.Op != OpPublish && r.Op != OpPublishRelease && r.Op != OpRelease {
				owners++
			}
			calls = append(calls, called{t: r.Time, rec: int32(i), j: int32(len(calls)), proc: procs.put(r.Proc, r.ID, int32(len(calls)))})
		case KindEvent:
			h.Events = append(h.Events, *r)
		}
	}
	if !sorted { // in call order, ties in the records' order: a stable sort by call time
		slices.SortFunc(calls, func(a, b called) int { return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.j, b.j)) })
	}
	// The Ops lie in ops grouped by resource, each resource's in call order, and h.Ops points
	// to them in call order: the checks of one resource then read its operations in order, not
	// one in every few hundred bytes (at a million operations on 8 resources, a cache miss per
	// operation and pass); the passes across resources read one run per resource.
	resOf, first := h.numberResources(recs, calls)
	at := make([]int32, len(calls)) // at[j]: the place in ops of the j-th call in the records' order
	ops := make([]Op, len(calls))
	h.Ops = make([]*Op, len(calls))
	for i, c := range calls {
		n := resOf[i]
		k := first[n]
		first[n]++
		at[c.j] = k
		r := &recs[c.rec]
		ops[k] = Op{Index: i, procN: c.proc, ResN: n, ID: r.ID, Kind: constant(r.Op),
			Resource: h.resources[n], Owner: r.Owner, Epoch: r.Epoch, Gen: r.Gen, TTLMs: r.TTLMs, Payload: r.Payload,
			Call: r.Time, Out: OutUnknown, StoreEpoch: r.StoreEpoch, ReadOwner: r.ReadOwner, ReadPub: r.ReadPub}
		h.Ops[i] = &ops[k]
	}
	for i := range recs {
		r := &recs[i]
		if r.Kind != KindReturn && r.Kind != KindNote {
			continue
		}
		j := procs.get(r.Proc, r.ID)
		if j < 0 {
			continue
		}
		op := &ops[at[j]]
		if r.Kind == KindNote {
			op.Note = r.Detail
			continue
		}
		op.Return, op.Out, op.Err, op.returned = r.Time, constant(r.Out), r.Err, true
		op.LeaseUntilUs, op.NowUs = r.LeaseUntilUs, r.NowUs
		if r.Out == "" || r.Out == OutUnknown {
			op.Out = OutUnknown
		}
		switch op.Kind {
		case OpAcquire:
			op.Epoch, op.Gen = r.Epoch, r.Gen
		case OpBump:
			op.Epoch = r.Epoch
		case OpSnapshot:
			op.ReadGen, op.ReadOwner, op.ReadPub, op.Payload, op.StoreEpoch = r.Gen, r.ReadOwner, r.ReadPub, r.Payload, r.StoreEpoch
		case OpShow:
			op.ReadGen, op.ReadOwner, op.ReadPub, op.PayloadBytes = r.Gen, r.ReadOwner, r.ReadPub, r.PayloadBytes
			op.StoreEpoch = r.StoreEpoch
		case OpGet:
			op.ReadPub, op.Payload = r.ReadPub, r.Payload
		}
	}
	h.End = maxTime + 1
	if len(recs) == 0 {
		h.Start = 0
	}
	h.number(ops, procs.names, owners)
	sort.SliceStable(h.Events, func(i, j int) bool { return h.Events[i].Time < h.Events[j].Time })
	return h
}

// called is a call record's place: its time, its index in the records and among the calls,
// and its process's number.
type called struct {
	t            int64
	rec, j, proc int32
}

// numberResources numbers the calls' resources in sorted order (History.resources): resOf[i]
// is the i-th call's, and first[n] the place in the history's slice of Ops of resource n's
// first operation, when each resource's operations follow those of the resources before it.
func (h *History) numberResources(recs []Record, calls []called) (resOf, first []int32) {
	// Numbered in the order they appear, then renumbered in sorted order.
	byName := map[string]int32{}
	resOf = make([]int32, len(calls))
	var count []int32
	for i, c := range calls {
		r := recs[c.rec].Resource
		n, ok := byName[r]
		if !ok {
			n = int32(len(h.resources))
			byName[r] = n
			h.resources = append(h.resources, r)
			count = append(count, 0)
		}
		resOf[i] = n
		count[n]++
	}
	sorted := slices.Clone(h.resources)
	sort.Strings(sorted)
	renumber := make([]int32, len(sorted))
	first = make([]int32, len(sorted))
	k := int32(0)
	for i, r := range sorted {
		n := byName[r]
		renumber[n], first[i] = int32(i), k
		k += count[n]
	}
	h.resources = sorted
	for i, n := range resOf {
		resOf[i] = renumber[n]
	}
	return resOf, first
}

// number settles what Build leaves after pairing: an unknown outcome's return, the owners'
// numbers, and one copy of each shared string.
func (h *History) number(ops []Op, procs []string, owners int) {
	// Owners are numbered in the order of ops (by resource, then call), each operation's Owner
	// before its ReadOwner. Most
	// operations name the owner their process named last (its lease), and most reads the
	// owner last numbered on their resource (its holder): both are compared before the map,
	// whose table, at a million operations, is a cache miss per lookup.
	numbers := make(map[string]int32, owners+16) // sized once: no table copied as it grows
	h.Owners = make([]string, 1, owners+16)
	number := func(o string) int32 {
		n, ok := numbers[o]
		if !ok {
			n = int32(len(h.Owners))
			numbers[o] = n
			h.Owners = append(h.Owners, o)
		}
		return n
	}
	type last struct {
		s string
		n int32
	}
	byProc := make([]last, len(procs))
	byRes := make([]last, len(h.resources)) // the owner last numbered on each resource
	for i := range ops {
		op := &ops[i]
		if op.Unknown() && (op.Note == "" || op.Return == 0) {
			// An unknown outcome may take effect at any moment after the call, so it returns
			// at the end of the history; except a reply the drop-reply fault threw away: the
			// worker's wrapper had the database's answer before its RETURN record (the fault
			// drops only definite answers, never a transport error), so the effect, whatever
			// it was, lies within the recorded interval (its outcome stays unknown to the
			// checker).
			op.Return = h.End
		}
		op.Proc = procs[op.procN]
		op.kind, op.out = kindOf(op.Kind), outcomeOf(op.Out)
		n := op.ResN
		if p := &byProc[op.procN]; op.Owner != "" {
			if op.Owner != p.s {
				p.n = number(op.Owner)
				p.s = h.Owners[p.n]
			}
			op.OwnerN, op.Owner = p.n, p.s
			byRes[n] = *p
		}
		if op.ReadOwner != "" {
			if r := &byRes[n]; op.ReadOwner != r.s {
				r.n = number(op.ReadOwner)
				r.s = h.Owners[r.n]
			}
			op.ReadOwnerN, op.ReadOwner = byRes[n].n, byRes[n].s
		}
	}
}

// pairing finds a call by its process and its number within the process. Processes are few
// and numbered through a small map; a process's calls, numbered 1, 2, 3... by its Recorder,
// sit in a slice indexed by that number. A number far from that pattern (a history written
// by hand) goes to a map, so that no input makes the slices large.
type pairing struct {
	names  []string
	byName map[string]int32
	lastP  int32     // the process named last, compared before the map
	dense  [][]int32 // by process and number: 1 + the call's index, 0 for none
	sparse map[procCall]int32
}

type procCall struct {
	proc int32
	id   int64
}

// number is proc's number, given to it at its first call.
func (p *pairing) number(proc string) int32 {
	if len(p.names) > 0 && p.names[p.lastP] == proc {
		return p.lastP
	}
	n, ok := p.byName[proc]
	if !ok {
		if p.byName == nil {
			p.byName = map[string]int32{}
		}
		n = int32(len(p.names))
		p.byName[proc] = n
		p.names = append(p.names, proc)
		p.dense = append(p.dense, nil)
	}
	p.lastP = n
	return n
}

// put records call j as (proc, id), and returns proc's number; a later call with the same
// pair replaces it.
func (p *pairing) put(proc string, id int64, j int32) int32 {
	n := p.number(proc)
	d := p.dense[n]
	if id >= 0 && id <= 2*int64(len(d))+64 {
		for int64(len(d)) <= id {
			d = append(d, 0)
		}
		d[id], p.dense[n] = j+1, d
		return n
	}
	// Not in the slice's range, now or ever before (it only grows): an entry of the slice,
	// which get reads first, replaces this one only when a later call takes the same pair.
	if p.sparse == nil {
		p.sparse = map[procCall]int32{}
	}
	p.sparse[procCall{n, id}] = j
	return n
}

// get is the call recorded as (proc, id), -1 when none was.
func (p *pairing) get(proc string, id int64) int32 {
	n := p.lastP
	if len(p.names) == 0 || p.names[n] != proc {
		var ok bool
		if n, ok = p.byName[proc]; !ok {
			return -1
		}
		p.lastP = n
	}
	if d := p.dense[n]; id >= 0 && id < int64(len(d)) && d[id] > 0 {
		return d[id] - 1
	}
	if j, ok := p.sparse[procCall{n, id}]; ok {
		return j
	}
	return -1
}

// constant returns the Op or Out constant equal to s, or s: comparing an operation's kind or
// outcome with a constant then compares two pointers, without reading the bytes of a string
// decoded from the history (at a million operations, a cache miss each).
func constant(s string) string {
	for _, c := range constants {
		if s == c {
			return c
		}
	}
	return s
}

var constants = []string{OpAcquire, OpRenew, OpPublish, OpPublishRelease, OpRelease, OpShow, OpGet, OpSnapshot,
	OpRestore, OpBump, OpFence, OpGateWrite, OutOK, OutBusy, OutRefused, OutNotFound, OutFailed, OutUnknown}

// Resources lists the resources in the history, sorted.
func (h *History) Resources() []string {
	if h.resources != nil || len(h.Ops) == 0 {
		return h.resources
	}
	seen := map[string]bool{}
	var out []string
	for _, op := range h.Ops {
		if !seen[op.Resource] {
			seen[op.Resource] = true
			out = append(out, op.Resource)
		}
	}
	sort.Strings(out)
	return out
}

// Describe renders an operation on one line, with times in seconds from the history's start.
func (h *History) Describe(op *Op) string {
	var b strings.Builder
	ret := "…never (unknown)"
	if !op.Unknown() {
		ret = fmt.Sprintf("%.3fs", h.Seconds(op.Return))
	}
	fmt.Fprintf(&b, "#%d [%.3fs → %s] %s %s %s", op.Index, h.Seconds(op.Call), ret, op.Proc, op.Kind, op.Resource)
	switch op.Kind {
	case OpAcquire:
		fmt.Fprintf(&b, " owner=%s ttl=%dms → %s", short(op.Owner), op.TTLMs, op.Out)
		if op.Out == OutOK {
			fmt.Fprintf(&b, " epoch %d generation %d", op.Epoch, op.Gen)
		}
	case OpShow:
		fmt.Fprintf(&b, " → %s", op.Out)
		if op.Out == OutOK {
			fmt.Fprintf(&b, " generation %d owner %s published %d (%d bytes)", op.ReadGen, shortOr(op.ReadOwner), op.ReadPub, op.PayloadBytes)
		}
	case OpGet:
		fmt.Fprintf(&b, " → %s", op.Out)
		if op.Out == OutOK {
			fmt.Fprintf(&b, " published %d payload %s", op.ReadPub, op.Payload)
		}
	case OpSnapshot:
		fmt.Fprintf(&b, " → %s", op.Out)
		if op.Out == OutOK {
			fmt.Fprintf(&b, " copy holds epoch %d generation %d owner %s published %d", op.StoreEpoch, op.ReadGen, shortOr(op.ReadOwner), op.ReadPub)
		}
	case OpRestore:
		fmt.Fprintf(&b, " back to epoch %d generation %d owner %s published %d → %s", op.StoreEpoch, op.Gen, shortOr(op.Owner), op.ReadPub, op.Out)
	case OpBump:
		fmt.Fprintf(&b, " → %s", op.Out)
		if op.Out == OutOK {
			fmt.Fprintf(&b, " epoch %d", op.Epoch)
		}
	default:
		fmt.Fprintf(&b, " owner=%s epoch %d generation %d", short(op.Owner), op.Epoch, op.Gen)
		if op.Payload != "" {
			fmt.Fprintf(&b, " payload %s", op.Payload)
		}
		fmt.Fprintf(&b, " → %s", op.Out)
	}
	if op.Err != "" {
		fmt.Fprintf(&b, " (%s)", op.Err)
	}
	if op.Note != "" {
		fmt.Fprintf(&b, " [%s]", op.Note)
	}
	return b.String()
}

// Seconds converts a monotonic time to seconds since the history's start.
func (h *History) Seconds(t int64) float64 { return float64(t-h.Start) / 1e9 }

func short(owner string) string {
	if len(owner) > 6 {
		return owner[:6]
	}
	return owner
}

func shortOr(owner string) string {
	if owner == "" {
		return "none"
	}
	return short(owner)
}
