package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

// etcdCopy is the restore fault's copy of an etcd store: a snapshot of the whole cluster's data
// through the client's Snapshot API (what etcdctl snapshot save writes), restored by the user's
// --restore-cmd, which must stop the member(s), restore the snapshot file named by
// $FENCED_SNAPSHOT into fresh data directories (etcdutl, or etcdctl before 3.5, snapshot
// restore) and start them from there. Unlike the SQL copies, the whole cluster goes back, its
// leases and every other key included: the fault applies only to an etcd the run owns.
type etcdCopy struct {
	d         *etcd.Driver
	resources []string
	path      string // the snapshot file
	command   string // --restore-cmd
	addr      string // the first endpoint, waited for after the command
}

// take saves the snapshot and reads what it holds for each resource. The workers and the
// reader are held at the barrier meanwhile, so nothing the model sees changes between the
// snapshot and the reads: only owner keys can go (an etcd lease running out), and the reads
// take the owner from the holder key, which outlives expiry, as the model's owner does.
func (c *etcdCopy) take(ctx context.Context) (map[string]torture.State, error) {
	if err := c.save(ctx); err != nil {
		return nil, fmt.Errorf("snapshot etcd: %w", err)
	}
	out := map[string]torture.State{}
	for _, r := range c.resources {
		st, err := c.d.Read(ctx, r)
		if err != nil {
			return nil, fmt.Errorf("read %s after the snapshot: %w", r, err)
		}
		payload, _, err := c.d.ReadPayload(ctx, r)
		if err != nil {
			return nil, fmt.Errorf("read %s after the snapshot: %w", r, err)
		}
		out[r] = torture.State{Epoch: st.CurrentEpoch, Generation: st.Generation, Owner: st.Owner,
			PublishedGeneration: st.PublishedGeneration, Payload: string(payload)}
	}
	return out, nil
}

// save streams the snapshot into a temporary file, syncs it and renames it into place, so that
// the restore command never sees half a snapshot.
func (c *etcdCopy) save(ctx context.Context) error {
	rc, err := c.d.Client().Snapshot(ctx)
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp := c.path + ".part"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, c.path)
}

// restore runs the restore command, waits for the endpoint's port and then for a read to
// succeed, so that the bump that follows finds the client connected again.
func (c *etcdCopy) restore(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", c.command)
	cmd.Env = append(os.Environ(), "FENCED_SNAPSHOT="+c.path)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("restore command: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := waitPort(ctx, c.addr, true); err != nil {
		return fmt.Errorf("restore command: etcd did not come back: %w", err)
	}
	for {
		_, err := c.d.Client().Get(ctx, "fenced-torture-restored")
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restore command: etcd answers no read: %w", err)
		case <-time.After(100 * time.Millisecond): // polling the server's state, not ordering work
		}
	}
}

func (c *etcdCopy) drop(context.Context) { _ = os.Remove(c.path) }

// etcdRestoreApplies says whether the restore fault can run on this etcd, or why not.
func etcdRestoreApplies(restoreCmd string) error {
	if restoreCmd == "" {
		return errors.New("needs --restore-cmd for etcd: the restore puts a snapshot of the whole cluster back " +
			"(etcdutl snapshot restore into a fresh data directory), which only the command that runs the members can do")
	}
	return nil
}
