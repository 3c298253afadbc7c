package etcd

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/driver"
)

// Key layout. Each resource is a handful of keys under <prefix><resource>/; the suffix after the
// last "/" names the field, so a resource name that itself contains "/" cannot collide with
// another resource's keys.
//
//	gen     the token of the current generation, and the lease's holder while it has one:
//	        token(epoch, generation) (genWidth digits each, so that one bytewise Compare pins
//	        both), then, from the acquisition until the release, the owner's id, a NUL byte and
//	        the expiry shown to people (local clock at grant + granted TTL, unix nanoseconds,
//	        genWidth digits; informational only: nothing compares it). The owner part outlives
//	        expiry, so that a refusal can be explained as "expired" rather than "released" and
//	        the owner of an expired, unsuperseded lease can still release it; a release puts the
//	        bare token back. Owners never contain control characters (checkOwner), so
//	        token+owner < gen < token+owner+"\x01" holds exactly for this owner's gen (see
//	        holderIs). Exists iff provisioned; epoch 0 before the first acquisition.
//	owner   the current owner's id, put WITH the acquisition's etcd lease: it exists exactly
//	        while the lease is held and unexpired, and etcd deletes it when the lease's TTL runs
//	        out. etcd, not this process, decides expiry.
//	pub     "<published generation> <published epoch> <published_at unix ns> <payload size>",
//	        the generation in the same fixed width as gen's fields.
//	source  the published payload's source version, fixed width (0: none given). Created by
//	        Provision, because etcd fails every Value compare on a missing key.
//	payload the published payload, raw bytes.
//
// Keys of the whole store, which cannot be a resource's (no field is named "epoch", "schema"
// or "op"):
//
//	<prefix>epoch          the store's epoch, fixed width; Migrate creates it at the clock (µs)
//	<prefix>schema         the layout version (3; version 2 kept the holder and the expiry in
//	                       keys of their own, holder and until, which Migrate folds into gen)
//	<prefix>ops/<id>/op    one operation id's outcome (see encodeOp); never overwritten
type keys struct {
	gen, owner, pub, source, payload string
}

func (d *Driver) keys(resource string) keys {
	// One allocation: the five keys one after the other in one string, each a slice of it.
	fields := [...]string{"gen", "owner", "pub", "source", "payload"}
	base := len(d.prefix) + len(resource) + 1
	var b strings.Builder
	b.Grow(len(fields)*base + len("genownerpubsourcepayload"))
	var ends [len(fields)]int
	for i, f := range fields {
		b.WriteString(d.prefix)
		b.WriteString(resource)
		b.WriteByte('/')
		b.WriteString(f)
		ends[i] = b.Len()
	}
	all := b.String()
	key := func(i int) string { return all[ends[i]-base-len(fields[i]) : ends[i]] }
	return keys{gen: key(0), owner: key(1), pub: key(2), source: key(3), payload: key(4)}
}

func (d *Driver) epochKey() string  { return d.prefix + "epoch" }
func (d *Driver) schemaKey() string { return d.prefix + "schema" }
func (d *Driver) opsPrefix() string { return d.prefix + "ops/" }

// opSuffix ends every operation key, so that a resource whose name starts with "ops/" (whose
// keys end with a field name) is never taken for an operation.
const opSuffix = "/op"

func (d *Driver) opKey(id string) string { return d.opsPrefix() + id + opSuffix }

// genWidth digits hold every positive int64 (at most 19 digits).
const genWidth = 20

// encodeGen writes a generation zero-padded to genWidth digits. With a fixed width, etcd's
// bytewise comparison of values orders generations numerically, so "published generation <
// g" can be a Compare(Value(pub), "<", encodeGen(g)) evaluated by etcd inside the Txn. The pub
// value starts with the same fixed-width field followed by a space, so it compares below
// encodeGen(g) exactly when its generation is below g (a longer string with an equal prefix
// compares greater, so a pub at generation g is not "< g").
func encodeGen(g int64) string {
	if g < 0 {
		return fmt.Sprintf("%0*d", genWidth, g) // not a generation; decodeGen refuses it
	}
	var b [genWidth]byte
	return string(appendGen(b[:0], g))
}

// appendGen appends encodeGen(g), g >= 0, without fmt: every Txn of an acquisition and a
// release encodes three of them.
func appendGen(b []byte, g int64) []byte {
	var digits [genWidth]byte
	d := strconv.AppendInt(digits[:0], g, 10)
	for range genWidth - len(d) {
		b = append(b, '0')
	}
	return append(b, d...)
}

// encodeToken is the gen key's value: epoch then generation, both fixed width. Bytewise order
// is (epoch, generation) order, so "acquired in an epoch before e" is
// Compare(Value(gen), "<", encodeToken(e, 0)).
func encodeToken(epoch, g int64) string {
	if epoch < 0 || g < 0 {
		return encodeGen(epoch) + encodeGen(g)
	}
	var b [2 * genWidth]byte
	return string(appendGen(appendGen(b[:0], epoch), g))
}

// encodeHeld is the gen key's value while owner holds the lease: the token, the owner, a NUL
// byte and the informational expiry.
func encodeHeld(epoch, g int64, owner string, until time.Time) string {
	var num [genWidth]byte
	var b strings.Builder // one allocation: Grow's
	b.Grow(3*genWidth + len(owner) + 1)
	b.Write(appendGen(num[:0], epoch))
	b.Write(appendGen(num[:0], g))
	b.WriteString(owner)
	b.WriteByte(0)
	b.Write(appendGen(num[:0], max(until.UnixNano(), 0)))
	return b.String()
}

// heldValue is a decoded gen value.
type heldValue struct {
	epoch, gen int64
	owner      string    // "" when released (the bare token)
	until      time.Time // zero when released
	held       bool
}

func decodeHeld(b []byte) (heldValue, error) {
	var v heldValue
	if len(b) < 2*genWidth {
		return v, fmt.Errorf("decode token %q: not two %d-digit numbers", b, genWidth)
	}
	var err error
	if v.epoch, v.gen, err = decodeToken(b[:2*genWidth]); err != nil || len(b) == 2*genWidth {
		return v, err
	}
	rest := b[2*genWidth:]
	nul := len(rest) - genWidth - 1
	if nul < 0 || rest[nul] != 0 {
		return v, fmt.Errorf("decode gen %q: not a token, an owner, NUL and a %d-digit time", b, genWidth)
	}
	ns, err := decodeGen(rest[nul+1:])
	if err != nil {
		return v, fmt.Errorf("decode gen %q: %w", b, err)
	}
	v.owner, v.until, v.held = string(rest[:nul]), time.Unix(0, ns).UTC(), true
	return v, nil
}

// checkOwner refuses an owner that the gen key cannot hold: a NUL would end it early, and
// any control character is refused as fenced.ValidateOwner does, which drivertest and other
// direct callers of the driver bypass.
func checkOwner(owner string) error {
	for _, c := range owner {
		if unicode.IsControl(c) {
			return driver.NotApplied(fmt.Errorf("owner %q contains the control character %q, which the etcd backend cannot store", owner, c))
		}
	}
	return nil
}

func decodeToken(b []byte) (epoch, g int64, err error) {
	if len(b) != 2*genWidth {
		return 0, 0, fmt.Errorf("decode token %q: not two %d-digit numbers", b, genWidth)
	}
	if epoch, err = decodeGen(b[:genWidth]); err != nil {
		return 0, 0, err
	}
	g, err = decodeGen(b[genWidth:])
	return epoch, g, err
}

func decodeGen(b []byte) (int64, error) {
	g, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || len(b) != genWidth || g < 0 {
		return 0, fmt.Errorf("decode generation %q: not a %d-digit generation", b, genWidth)
	}
	return g, nil
}

// publication is the decoded pub key.
type publication struct {
	generation int64
	epoch      int64
	at         time.Time
	size       int64
}

func encodePub(g, epoch int64, at time.Time, size int) string {
	return fmt.Sprintf("%s %d %d %d", encodeGen(g), epoch, at.UnixNano(), size)
}

func decodePub(b []byte) (publication, error) {
	fields := strings.Fields(string(b))
	var p publication
	var err error
	if len(fields) != 1 && len(fields) != 4 {
		return p, fmt.Errorf("decode publication %q: want 1 or 4 fields", b)
	}
	if p.generation, err = decodeGen([]byte(fields[0])); err != nil {
		return p, fmt.Errorf("decode publication: %w", err)
	}
	if len(fields) == 1 { // provisioned, never published
		return p, nil
	}
	epoch, err1 := strconv.ParseInt(fields[1], 10, 64)
	at, err2 := strconv.ParseInt(fields[2], 10, 64)
	size, err3 := strconv.ParseInt(fields[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return p, fmt.Errorf("decode publication %q: bad epoch, time or size", b)
	}
	p.epoch, p.at, p.size = epoch, time.Unix(0, at).UTC(), size
	return p, nil
}

// encodeOp is an operation key's value: "aborted <recorded_at unix ns>" or "accepted
// <recorded_at> <epoch> <generation> <resource>", the resource last because it may contain
// spaces. recorded_at is the recording client's clock: etcd has none.
func encodeOp(op driver.Operation) string {
	if op.Outcome != driver.OutcomeAccepted {
		return fmt.Sprintf("%s %d", op.Outcome, op.RecordedAt.UnixNano())
	}
	return fmt.Sprintf("%s %d %d %d %s", op.Outcome, op.RecordedAt.UnixNano(), op.Epoch, op.Generation, op.Resource)
}

func decodeOp(id string, b []byte) (driver.Operation, error) {
	op := driver.Operation{OpID: id}
	fields := strings.SplitN(string(b), " ", 5)
	bad := fmt.Errorf("decode operation %s: %q", id, b)
	if len(fields) < 2 {
		return op, bad
	}
	at, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return op, bad
	}
	op.Outcome, op.RecordedAt = fields[0], time.Unix(0, at).UTC()
	switch {
	case op.Outcome == driver.OutcomeAborted && len(fields) == 2:
		return op, nil
	case op.Outcome != driver.OutcomeAccepted || len(fields) != 5:
		return driver.Operation{OpID: id}, bad
	}
	epoch, err1 := strconv.ParseInt(fields[2], 10, 64)
	g, err2 := strconv.ParseInt(fields[3], 10, 64)
	if err1 != nil || err2 != nil {
		return driver.Operation{OpID: id}, bad
	}
	op.Epoch, op.Generation, op.Resource = epoch, g, fields[4]
	return op, nil
}

func decodeTime(b []byte) (time.Time, error) {
	ns, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("decode time %q: %w", b, err)
	}
	return time.Unix(0, ns).UTC(), nil
}

func encodeTime(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// ttlSeconds converts a lease TTL to etcd's whole seconds, rounding up: the etcd lease may
// outlive the requested TTL but never falls short of it, so the holder's local trust window
// (which ends before ttl has passed) always ends before etcd lets another owner in. etcd also
// raises a TTL below its own minimum (1.5 × election timeout, 2 s with the default settings).
func ttlSeconds(ttl time.Duration) int64 {
	s := int64((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

// kv returns the single key-value of the i-th response of a Txn, or nil when the key was
// absent. Every Get in this package reads one key.
func kv(resp *clientv3.TxnResponse, i int) *kvPair {
	r := resp.Responses[i].GetResponseRange()
	if r == nil || len(r.Kvs) == 0 {
		return nil
	}
	return &kvPair{value: r.Kvs[0].Value, modRevision: r.Kvs[0].ModRevision, lease: r.Kvs[0].Lease}
}

// deleted returns the key-value that the i-th response of a Txn, a delete of one key with
// WithPrevKV, deleted, or nil when the key was absent.
func deleted(resp *clientv3.TxnResponse, i int) *kvPair {
	r := resp.Responses[i].GetResponseDeleteRange()
	if r == nil || len(r.PrevKvs) == 0 {
		return nil
	}
	return &kvPair{value: r.PrevKvs[0].Value, modRevision: r.PrevKvs[0].ModRevision, lease: r.PrevKvs[0].Lease}
}

type kvPair struct {
	value       []byte
	modRevision int64
	lease       int64
}
