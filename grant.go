package fenced

import (
	"context"
	"errors"
	"fmt"

	"github.com/fenced-dev/fenced/driver"
)

// Access is what Store.Grant lets a role do; each level includes the one before it.
type Access = driver.Access

const (
	// AccessReader: Show, Get and reading a publication's recorded outcome
	// (Store.LookupOperation); nothing that writes.
	AccessReader = driver.AccessReader
	// AccessWorker: Acquire, Renew, Publish, Release, Resolve, and everything AccessReader may.
	// The default: the least that runs the protocol.
	AccessWorker = driver.AccessWorker
	// AccessAdmin: everything AccessWorker may, plus Provision, BumpEpoch and PruneOperations.
	// Provision is an admin's because it decides which resources exist: a worker takes the
	// leases it is given, and cannot fill the store with names of its choosing.
	AccessAdmin = driver.AccessAdmin
)

// ErrPermissionDenied is matched by the database's refusal of an operation to the role the
// store is connected as (not granted to it, or the resource is outside its prefixes). Nothing
// changed. The error is a *driver.PermissionError naming the operation and the role.
var ErrPermissionDenied = driver.ErrPermission

// ParseAccess reads a level by name: worker, reader or admin.
func ParseAccess(name string) (Access, error) {
	for _, a := range []Access{AccessWorker, AccessReader, AccessAdmin} {
		if name == a.String() {
			return a, nil
		}
	}
	return 0, invalid("access", "%q is not a level; use worker, reader or admin", name)
}

// GrantOptions says what Store.Grant gives a role. nil means the defaults.
type GrantOptions struct {
	// Access is the role's level. Default AccessWorker.
	Access Access
	// Prefixes limits the role to resources whose names start with one of them, checked by
	// the database inside every routine that names a resource. Default: none, every resource.
	// A prefix-limited role can still resolve any operation id it knows (an id names no
	// resource until it is recorded).
	Prefixes []string
}

// Grant installs the protocol's database routines and grants role the right to execute those
// its level includes (see Access) and nothing else on fenced's tables, so that code connected
// as role cannot write the tables without the fence. Granting a role again with another level
// or other prefixes replaces what it had: rights the new level does not include are revoked.
// A store connected as role works unchanged, and is refused what it was not granted with
// ErrPermissionDenied by the database itself. Backends without routines and roles (SQLite,
// etcd, Redis) return an error matching errors.ErrUnsupported.
func (s *Store) Grant(ctx context.Context, role string, opts *GrantOptions) error {
	g, ok := s.drv.(driver.Granter)
	if !ok {
		return fmt.Errorf("grant %q: this backend has no roles to grant: %w", role, errors.ErrUnsupported)
	}
	if err := validRole(role); err != nil {
		return err
	}
	var spec driver.GrantSpec
	if opts != nil {
		spec.Access = opts.Access
		for _, p := range opts.Prefixes {
			if err := driver.ValidPrefix(p); err != nil {
				return invalid("prefix", "%s", err)
			}
			if len(p) > MaxResourceLen {
				return invalid("prefix", "%q is longer than a resource name may be", p)
			}
			spec.Prefixes = append(spec.Prefixes, p)
		}
	}
	if !spec.Access.Includes(AccessReader) {
		return invalid("access", "%v is not a level", spec.Access)
	}
	if err := g.Grant(ctx, role, spec); err != nil {
		return fmt.Errorf("grant %q: %w", role, err)
	}
	return nil
}

// LookupOperation reads the recorded outcome of a publication by its operation id without
// recording anything: found is false when no outcome is recorded yet (the publication may
// still arrive; Resolve settles it). It is Resolve's read-only form, which AccessReader
// includes.
func (s *Store) LookupOperation(ctx context.Context, opID string) (r Resolution, found bool, err error) {
	if err := validOpID(opID); err != nil {
		return Resolution{}, false, err
	}
	op, err := s.drv.ReadOperation(ctx, opID)
	if err != nil {
		return Resolution{}, false, fmt.Errorf("look up operation %q: %w", opID, err)
	}
	if op.Outcome == "" {
		return Resolution{OpID: opID}, false, nil
	}
	r = Resolution{OpID: opID, Accepted: op.Outcome == driver.OutcomeAccepted, RecordedAt: op.RecordedAt}
	if r.Accepted {
		r.Resource, r.Token = op.Resource, Token{Epoch: op.Epoch, Generation: op.Generation}
	}
	return r, true, nil
}
