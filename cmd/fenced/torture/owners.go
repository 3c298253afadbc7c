package torture

// ownerMap is a map keyed by (owner, K), the owner by its number (Op.OwnerN), made for the
// checks' common case: one key per owner (an owner identity is made for one acquisition).
// That key and its value sit in a slice indexed by the owner, read without hashing; any
// further key of the same owner (a broken history, a restore handing a lease back) goes to an
// ordinary map. The slice is allocated once per check and reused from one resource to the
// next: clear empties the map in O(1), by moving to a new round.
type ownerMap[K comparable, V any] struct {
	round int32
	slots []ownerSlot[K, V]
	more  map[ownerKey[K]]*V
}

type ownerSlot[K comparable, V any] struct {
	round int32 // the slot holds a key only when this is the map's round
	key   K
	val   V
}

type ownerKey[K comparable] struct {
	owner int32
	key   K
}

func newOwnerMap[K comparable, V any](owners int) *ownerMap[K, V] {
	return &ownerMap[K, V]{round: 1, slots: make([]ownerSlot[K, V], owners)}
}

// get returns the value of (owner, k), nil when there is none. The pointer is valid until
// the next put or clear.
func (m *ownerMap[K, V]) get(owner int32, k K) *V {
	s := &m.slots[owner]
	if s.round != m.round {
		return nil
	}
	if s.key == k {
		return &s.val
	}
	return m.more[ownerKey[K]{owner, k}]
}

// put sets the value of (owner, k) to v.
func (m *ownerMap[K, V]) put(owner int32, k K, v V) {
	s := &m.slots[owner]
	switch {
	case s.round != m.round:
		*s = ownerSlot[K, V]{round: m.round, key: k, val: v}
	case s.key == k:
		s.val = v
	default:
		if m.more == nil {
			m.more = map[ownerKey[K]]*V{}
		}
		m.more[ownerKey[K]{owner, k}] = &v
	}
}

// clear empties the map.
func (m *ownerMap[K, V]) clear() {
	m.round++
	m.more = nil
}

// cop is an operation as the direct checks of one resource read it: numbers only, 64 bytes,
// in one slice per resource, so that their passes read contiguous memory and the garbage
// collector has nothing in it to scan. At a million operations a resource's operations
// (*Op, 256 bytes each, one heap object each) no longer fit the caches, and every pass of
// every check missed them once per operation. The i-th cop is the resource's i-th *Op, which
// the checks still read for what they report.
type cop struct {
	call, ret  int64
	epoch, gen int64
	readPub    int64
	leaseUntil int64 // Op.LeaseUntilUs
	ttl        int64 // Op.TTLMs
	owner      int32 // Op.OwnerN
	kind       opKind
	out        opOutcome
}

type opKind uint8

const (
	kindOther opKind = iota
	kindAcquire
	kindRenew
	kindPublish
	kindPublishRelease
	kindRelease
	kindShow
	kindGet
	kindBump
)

type opOutcome uint8

const (
	outOther opOutcome = iota
	outOK
	outUnknown
)

// kindNames and outcomeNames name the codes.
var (
	kindNames = [...]string{kindAcquire: OpAcquire, kindRenew: OpRenew, kindPublish: OpPublish,
		kindPublishRelease: OpPublishRelease, kindRelease: OpRelease, kindShow: OpShow, kindGet: OpGet, kindBump: OpBump}
	outcomeNames = [...]string{outOK: OutOK, outUnknown: OutUnknown}
)

func kindOf(s string) opKind {
	for k := kindAcquire; int(k) < len(kindNames); k++ {
		if kindNames[k] == s {
			return k
		}
	}
	return kindOther
}

func outcomeOf(s string) opOutcome {
	for k := outOK; int(k) < len(outcomeNames); k++ {
		if outcomeNames[k] == s {
			return k
		}
	}
	return outOther
}

// write is Op.Write: an operation of this kind carries a lease.
func (k opKind) write() bool {
	return k == kindRenew || k == kindPublish || k == kindPublishRelease || k == kindRelease
}

// compact appends ops, made by Build, as cops to buf.
func compact(buf []cop, ops []*Op) []cop {
	for _, op := range ops {
		buf = append(buf, cop{call: op.Call, ret: op.Return, epoch: op.Epoch, gen: op.Gen, readPub: op.ReadPub,
			leaseUntil: op.LeaseUntilUs, ttl: op.TTLMs, owner: op.OwnerN, kind: op.kind, out: op.out})
	}
	return buf
}

func (o *cop) tok() token { return token{o.epoch, o.gen} }

// write is Op.Write: the operation carries a lease.
func (o *cop) write() bool { return o.kind.write() }

// read is Op.Read.
func (o *cop) read() bool { return o.kind == kindShow || o.kind == kindGet }
