package etcd

import (
	"context"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// PublishUnfenced stores a payload as published by generation g of epoch, with no condition at
// all: one unconditional Txn of Puts, what a writer behind a plain lock does once it believes
// it holds the lock. It exists for fenced torture's --unfenced control, which must show the
// checker finding the writes this lets through (a superseded or expired holder's payload
// accepted, a published generation going back); nothing else should call it.
func (d *Driver) PublishUnfenced(ctx context.Context, resource string, epoch, g int64, payload []byte) error {
	k := d.keys(resource)
	_, err := d.txn(ctx, "unfenced publish", nil, []*pb.RequestOp{
		opPut(k.pub, encodePub(g, epoch, time.Now(), len(payload)), 0),
		opPut(k.payload, string(payload), 0),
	}, nil)
	return err
}
