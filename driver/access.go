package driver

import (
	"errors"
	"fmt"
	"strings"
)

// Access is what Grant lets a role do. Each level includes the one before it.
type Access int

const (
	// AccessWorker: acquire, renew, publish, release, resolve, and everything AccessReader may.
	// The zero value, so that a role granted without a choice gets the least that runs the
	// protocol.
	AccessWorker Access = iota
	// AccessReader: show, get and read an operation's recorded outcome; nothing that writes.
	AccessReader
	// AccessAdmin: everything AccessWorker may, plus provision, epoch bump and prune.
	AccessAdmin
)

// String is the level's name, as `fenced grant --as` takes it.
func (a Access) String() string {
	switch a {
	case AccessWorker:
		return "worker"
	case AccessReader:
		return "reader"
	case AccessAdmin:
		return "admin"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// Includes reports whether a role granted a may do what need requires.
func (a Access) Includes(need Access) bool {
	rank := func(x Access) int {
		switch x {
		case AccessReader:
			return 0
		case AccessWorker:
			return 1
		case AccessAdmin:
			return 2
		}
		return -1
	}
	return rank(a) >= 0 && rank(a) >= rank(need)
}

// GrantSpec is what a Granter grants: a level and, optionally, the resource-name prefixes the
// role is limited to (none: every resource).
type GrantSpec struct {
	Access   Access
	Prefixes []string
}

// ErrPermission matches every refusal by the database for lack of rights (*PermissionError).
var ErrPermission = errors.New("permission denied")

// PermissionError is the database's refusal of an operation to the role a driver is connected
// as: the role was not granted it, or the resource is outside the role's prefixes. Nothing
// changed. Its text is one sentence naming the operation and the role.
type PermissionError struct {
	Role      string // the user the driver connects as
	Operation string // in words: "bump the epoch", "acquire"
	Resource  string // set when the refusal is for a prefix
	Err       error  // the engine's error
}

func (e *PermissionError) Error() string {
	if e.Resource != "" {
		return fmt.Sprintf("role %s may not %s %q: the resource is outside the prefixes it was granted; nothing changed",
			e.Role, e.Operation, e.Resource)
	}
	return fmt.Sprintf("role %s may not %s: it was not granted this operation (fenced grant --as); nothing changed",
		e.Role, e.Operation)
}

func (e *PermissionError) Unwrap() []error { return []error{ErrPermission, ErrNotApplied, e.Err} }

// ValidPrefix checks one prefix a role may be limited to: not empty, no control characters.
func ValidPrefix(p string) error {
	if p == "" {
		return errors.New("a prefix must not be empty (grant without --prefix for every resource)")
	}
	if strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("prefix %q contains a control character", p)
	}
	return nil
}
