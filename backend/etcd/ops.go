package etcd

import (
	"reflect"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Txn parts, built as the protobuf messages etcd receives. clientv3's builders copy every
// compare twice by reflection (clientv3.Compare clones the Cmp it is given, and Txn.If clones
// each Cmp again with proto.Clone) and every op once more (Op.toRequestOp): on an
// acquire+release pair of five compares and four ops that was about a fifth of the pair's
// client-side allocations. These messages are built once per Txn and never shared or changed
// after they are sent, so nothing needs the copies.

// cmpValue compares key's value with v: result is pb.Compare_EQUAL, _LESS or _GREATER (etcd
// compares bytewise).
func cmpValue(key string, result pb.Compare_CompareResult, v string) *pb.Compare {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_VALUE, Result: result,
		TargetUnion: &pb.Compare_Value{Value: []byte(v)}}
}

// cmpModRevision requires key's mod revision to be rev (0: the key is absent).
func cmpModRevision(key string, rev int64) *pb.Compare {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_ModRevision{ModRevision: rev}}
}

// cmpAbsent requires key not to exist (its create revision is 0).
func cmpAbsent(key string) *pb.Compare {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_CREATE, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_CreateRevision{CreateRevision: 0}}
}

// opPut puts key = val, attached to the etcd lease when it is not 0.
func opPut(key, val string, lease clientv3.LeaseID) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: []byte(key), Value: []byte(val), Lease: int64(lease)}}}
}

// opGet reads one key; keysOnly leaves its value out of the answer.
func opGet(key string, keysOnly bool) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{
		Key: []byte(key), KeysOnly: keysOnly}}}
}

// opDelete deletes one key; prevKV returns the deleted key-value (see deleted).
func opDelete(key string, prevKV bool) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{
		Key: []byte(key), PrevKv: prevKV}}}
}

// ownKV tells whether the client's KV is the one clientv3.New installed, which sends each
// request as it is to the client's connection, and not a wrapper that the caller put in its
// place (namespace.NewKV prefixes every key): only then may txn send to the connection itself.
func ownKV(c *clientv3.Client) bool {
	return c.KV != nil && reflect.TypeOf(c.KV) == reflect.TypeOf(clientv3.NewKV(c))
}

// clientCmps and clientOps turn the messages back into clientv3's types, for a client whose KV
// was replaced (see ownKV).
func clientCmps(cmps []*pb.Compare) []clientv3.Cmp {
	out := make([]clientv3.Cmp, len(cmps))
	for i, c := range cmps {
		out[i] = clientv3.FromCompare(c)
	}
	return out
}

func clientOps(ops []*pb.RequestOp) []clientv3.Op {
	out := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			out[i] = clientv3.OpPut(string(r.RequestPut.Key), string(r.RequestPut.Value), clientv3.WithLease(clientv3.LeaseID(r.RequestPut.Lease)))
		case *pb.RequestOp_RequestRange:
			var opts []clientv3.OpOption
			if r.RequestRange.KeysOnly {
				opts = append(opts, clientv3.WithKeysOnly())
			}
			out[i] = clientv3.OpGet(string(r.RequestRange.Key), opts...)
		case *pb.RequestOp_RequestDeleteRange:
			var opts []clientv3.OpOption
			if r.RequestDeleteRange.PrevKv {
				opts = append(opts, clientv3.WithPrevKV())
			}
			out[i] = clientv3.OpDelete(string(r.RequestDeleteRange.Key), opts...)
		}
	}
	return out
}
