package etcd

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// PublishUnfenced stores a payload as published by generation g of epoch, with no condition at
// all: one unconditional Txn of Puts, what a writer behind a plain lock does once it believes
// it holds the lock. It exists for fenced torture's --unfenced control, which must show the
// checker finding the writes this lets through (a superseded or expired holder's payload
// accepted, a published generation going back); nothing else should call it.
func (d *Driver) PublishUnfenced(ctx context.Context, resource string, epoch, g int64, payload []byte) error {
	k := d.keys(resource)
	_, err := d.txn(ctx, "unfenced publish", nil, []clientv3.Op{
		clientv3.OpPut(k.pub, encodePub(g, epoch, time.Now(), len(payload))),
		clientv3.OpPut(k.payload, string(payload)),
	}, nil)
	return err
}
