package torture

import (
	"fmt"
	"hash/fnv"

	"github.com/anishathalye/porcupine"
)

// state is one resource's row as far as the checker can know it. Expiry is not in it: the
// model does not follow the database's clock, so a held lease may have expired at any moment
// (the clock checks in check.go use the engine times the replies carry).
type state struct {
	Epoch   int64 // the store's epoch: the least epoch an acquisition may be granted
	Gen     int64
	Owner   string // "" when released (an expired lease keeps its owner in the row)
	Pub     int64  // published generation
	Payload string // the published payload
}

// input and output are what porcupine sees of an operation.
type input struct {
	Kind    string
	Owner   string
	Gen     int64
	Payload string
	Epoch   int64 // restore: the copy's store epoch
	Pub     int64 // restore: the copy's published generation
}

type output struct {
	Out          string
	Epoch        int64 // acquire: granted; bump: the new epoch
	Gen          int64 // acquire: granted; show: read
	Owner        string
	Pub          int64
	Payload      string
	PayloadBytes int64
}

// model is the protocol for one resource. It is nondeterministic only in what an unknown
// outcome did: it may or may not have taken effect.
func model(init state) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByResource,
		Init:      func() []any { return []any{init} },
		Step: func(st, in, out any) []any {
			return step(st.(state), in.(input), out.(output))
		},
		Hash: func(st any) uint64 {
			s := st.(state)
			h := fnv.New64a()
			fmt.Fprintf(h, "%d|%d|%s|%d|%s", s.Epoch, s.Gen, s.Owner, s.Pub, s.Payload)
			return h.Sum64()
		},
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output)
			return fmt.Sprintf("%s(%s,%d) → %s %d", i.Kind, short(i.Owner), i.Gen, o.Out, o.Gen)
		},
		DescribeState: func(st any) string {
			s := st.(state)
			return fmt.Sprintf("epoch %d generation %d owner %s published %d", s.Epoch, s.Gen, shortOr(s.Owner), s.Pub)
		},
	}
	return nm.ToModel()
}

// partitionByResource: resources are independent, so each is checked on its own. The
// resource is carried in the operation's metadata.
func partitionByResource(ops []porcupine.Operation) [][]porcupine.Operation {
	byRes := map[string][]porcupine.Operation{}
	var order []string
	for _, op := range ops {
		r := op.Metadata.(*Op).Resource
		if _, ok := byRes[r]; !ok {
			order = append(order, r)
		}
		byRes[r] = append(byRes[r], op)
	}
	out := make([][]porcupine.Operation, 0, len(order))
	for _, r := range order {
		out = append(out, byRes[r])
	}
	return out
}

// step returns the states the resource may be in after the operation, none if the operation
// could not have returned what it did from st: porcupine's form of after.
func step(st state, in input, out output) []any {
	o := after(st, in, out)
	states := make([]any, o.n)
	for i := range o.n {
		states[i] = o.s[i]
	}
	return states
}

// outcomes is the states an operation may leave the resource in: at most two (an unknown
// outcome took effect or did not), held by value so that the search allocates nothing per step.
type outcomes struct {
	s [2]state
	n int
}

func one(s state) outcomes    { return outcomes{[2]state{s}, 1} }
func two(a, b state) outcomes { return outcomes{[2]state{a, b}, 2} }

// after returns the states the resource may be in after the operation, none if the operation
// could not have returned what it did from st.
func after(st state, in input, out output) outcomes {
	unchanged := one(st)
	if out.Out == OutFailed {
		return unchanged // the driver proved that nothing changed
	}
	switch in.Kind {
	case OpAcquire:
		// A held lease may have expired at any moment, so an acquisition may succeed whatever
		// the owner; it must then take exactly the next generation, for a new owner, with at
		// least the store's epoch (larger when the engine bumped it by itself: Redis after a
		// restart with a new run id).
		next := state{Epoch: st.Epoch, Gen: st.Gen + 1, Owner: in.Owner, Pub: st.Pub, Payload: st.Payload}
		switch out.Out {
		case OutOK:
			if out.Gen == st.Gen+1 && in.Owner != st.Owner && out.Epoch >= st.Epoch {
				next.Epoch = out.Epoch
				return one(next)
			}
			return outcomes{}
		case OutBusy:
			return unchanged // an unexpired lease may be there: the checker cannot tell
		case OutUnknown:
			return two(st, next)
		}
		return outcomes{}
	case OpPublish, OpPublishRelease:
		current := st.Owner == in.Owner && st.Gen == in.Gen && in.Gen > st.Pub
		next := state{Epoch: st.Epoch, Gen: st.Gen, Owner: st.Owner, Pub: in.Gen, Payload: in.Payload}
		if in.Kind == OpPublishRelease {
			next.Owner = ""
		}
		switch out.Out {
		case OutOK:
			if current {
				return one(next)
			}
			return outcomes{}
		case OutRefused:
			return unchanged // the lease may have expired
		case OutUnknown:
			if current {
				return two(st, next)
			}
			return unchanged
		}
		return outcomes{}
	case OpRenew:
		switch out.Out {
		case OutOK:
			if st.Owner == in.Owner && st.Gen == in.Gen {
				return unchanged
			}
			return outcomes{}
		case OutRefused, OutUnknown:
			return unchanged
		}
		return outcomes{}
	case OpRelease:
		// Release does not look at expiry: it is refused exactly when the lease is not the
		// row's (owner, generation).
		current := st.Owner == in.Owner && st.Gen == in.Gen
		next := state{Epoch: st.Epoch, Gen: st.Gen, Pub: st.Pub, Payload: st.Payload}
		switch out.Out {
		case OutOK:
			if current {
				return one(next)
			}
			return outcomes{}
		case OutRefused:
			if !current {
				return unchanged
			}
			return outcomes{}
		case OutUnknown:
			if current {
				return two(st, next)
			}
			return unchanged
		}
		return outcomes{}
	case OpShow:
		switch out.Out {
		case OutOK:
			// An engine may clear an expired lease's owner (etcd deletes the key); none is
			// therefore always a possible reading of the owner.
			if out.Gen == st.Gen && out.Pub == st.Pub && (out.Owner == st.Owner || out.Owner == "") &&
				out.PayloadBytes == int64(len(st.Payload)) {
				return unchanged
			}
			return outcomes{}
		case OutUnknown:
			return unchanged
		}
		return outcomes{}
	case OpSnapshot:
		// The copy must hold a state the resource was in while the copy was taken.
		switch out.Out {
		case OutOK:
			if out.Gen == st.Gen && out.Owner == st.Owner && out.Pub == st.Pub && out.Payload == st.Payload {
				return unchanged
			}
			return outcomes{}
		case OutUnknown:
			return unchanged
		}
		return outcomes{}
	case OpRestore:
		// A restore is a legitimate rollback: the resource is whatever the copy held, its
		// store epoch included.
		restored := state{Epoch: in.Epoch, Gen: in.Gen, Owner: in.Owner, Pub: in.Pub, Payload: in.Payload}
		switch out.Out {
		case OutOK:
			return one(restored)
		case OutUnknown:
			return two(st, restored)
		}
		return outcomes{}
	case OpBump:
		// Every lease freed, the epoch raised; generations go on counting.
		bumped := state{Epoch: max(st.Epoch, out.Epoch), Gen: st.Gen, Pub: st.Pub, Payload: st.Payload}
		switch out.Out {
		case OutOK:
			if out.Epoch > st.Epoch {
				return one(bumped)
			}
			return outcomes{}
		case OutUnknown:
			return two(st, bumped)
		}
		return outcomes{}
	case OpSelfBump:
		// The engine's own bump after a restart: every lease freed, the epoch raised by an
		// amount the history does not show (the next acquisition's grant does).
		bumped := state{Epoch: st.Epoch, Gen: st.Gen, Pub: st.Pub, Payload: st.Payload}
		switch out.Out {
		case OutOK:
			return one(bumped)
		case OutUnknown:
			return two(st, bumped)
		}
		return outcomes{}
	case OpGet:
		switch out.Out {
		case OutOK:
			if out.Pub == st.Pub && out.Payload == st.Payload {
				return unchanged
			}
			return outcomes{}
		case OutNotFound:
			if st.Pub == 0 {
				return unchanged
			}
			return outcomes{}
		case OutUnknown:
			return unchanged
		}
		return outcomes{}
	}
	return outcomes{}
}

// modelOp is one operation as the model and the search read it.
type modelOp struct {
	in        input
	out       output
	call, ret int64
	// The owners in.Owner and out.Owner name, numbered from 0 within the operations
	// searched; -1 for none.
	inOwner, outOwner int32
}

// modelOps converts the history's operations (made by Build) for the model, leaving out
// those that change nothing whatever their outcome; searched[i] is the operation out[i] comes
// from. Owners are numbered from 0 through local, keyed by their numbers in the history
// (Op.OwnerN, Op.ReadOwnerN), which modelOps clears first.
func modelOps(ops []*Op, local *ownerMap[struct{}, int32]) (out []modelOp, searched []*Op) {
	local.clear()
	next := int32(0)
	number := func(n int32) int32 {
		if n == 0 { // History.Owners[0] is ""
			return -1
		}
		if id := local.get(n, struct{}{}); id != nil {
			return *id
		}
		local.put(n, struct{}{}, next)
		next++
		return next - 1
	}
	out, searched = make([]modelOp, 0, len(ops)), make([]*Op, 0, len(ops))
	for _, op := range ops {
		if op.Unknown() && (op.Read() || op.Kind == OpRenew) {
			continue // whether or not it happened, it changed nothing: leaving it out saves search
		}
		in := input{Kind: op.Kind, Owner: op.Owner, Gen: op.Gen, Payload: op.Payload}
		o := output{Out: op.Out}
		switch op.Kind {
		case OpAcquire:
			in.Gen = 0
			o.Epoch, o.Gen = op.Epoch, op.Gen
		case OpBump:
			in.Gen, o.Epoch = 0, op.Epoch
		case OpRestore:
			in.Epoch, in.Pub = op.StoreEpoch, op.ReadPub
		case OpSnapshot:
			o.Gen, o.Owner, o.Pub, o.Payload = op.ReadGen, op.ReadOwner, op.ReadPub, op.Payload
			in.Payload = ""
		case OpShow:
			o.Gen, o.Owner, o.Pub, o.PayloadBytes = op.ReadGen, op.ReadOwner, op.ReadPub, op.PayloadBytes
		case OpGet:
			in.Payload = ""
			o.Pub, o.Payload = op.ReadPub, op.Payload
		}
		// op.Return is End for an unknown outcome, but for a dropped reply (Build).
		m := modelOp{in: in, out: o, call: op.Call, ret: op.Return, inOwner: number(op.OwnerN), outOwner: -1}
		if o.Owner != "" {
			m.outOwner = number(op.ReadOwnerN)
		}
		out = append(out, m)
		searched = append(searched, op)
	}
	return out, searched
}

// porcupineOps converts the history's operations for porcupine.
func porcupineOps(ops []*Op) []porcupine.Operation {
	owners := int32(0) // History.Owners' length, as far as ops show it
	for _, op := range ops {
		owners = max(owners, op.OwnerN+1, op.ReadOwnerN+1)
	}
	mops, searched := modelOps(ops, newOwnerMap[struct{}, int32](int(owners)))
	return toPorcupine(mops, searched)
}

// toPorcupine is porcupine's form of modelOps' operations.
func toPorcupine(mops []modelOp, searched []*Op) []porcupine.Operation {
	ids := map[string]int{} // a small number per process, for porcupine's visualization
	out := make([]porcupine.Operation, len(mops))
	for i, m := range mops {
		op := searched[i]
		if _, ok := ids[op.Proc]; !ok {
			ids[op.Proc] = len(ids)
		}
		out[i] = porcupine.Operation{ClientId: ids[op.Proc], Input: m.in, Output: m.out, Call: m.call, Return: m.ret, Metadata: op}
	}
	return out
}
