// Package fenced makes "only the current owner may write" hold at the destination of the write.
//
// A lease can expire while the process that holds it is still running: paused by a debugger, a
// garbage collector, SIGSTOP or a slow network. Another process takes over and publishes; the
// first resumes and overwrites it. The lease service did nothing wrong. What was wrong is treating
// "I acquired a lease" as "I may keep writing".
//
// # The protocol
//
// Each resource is one row, created by Provision and never deleted, that holds the lease and the
// protected result side by side:
//
//	resource | generation | lease owner | lease until | published generation | payload | published at
//
// Every operation is decided by a single conditional statement that the database evaluates (some
// backends first lock the row in the same transaction, or commit several operations in one
// transaction, each still its own statement; see the backends' package docs):
//
//   - Acquire increments the generation and installs a fresh random owner, with an expiry of
//     database-now + ttl, only where the lease is free or expired. The fencing token is
//     (epoch, generation): every acquisition of a resource gets a larger one.
//   - Publish stores the payload only where the generation and owner still match, the lease has
//     not expired by the database's clock, and this generation has not published before.
//   - Renew extends the expiry only where generation and owner match and the lease has not
//     expired: a late renewal never revives a lease.
//   - Release frees the lease only where generation and owner match; it never resets the
//     generation. PublishAndRelease does both in one statement.
//
// Because acquisition and publication modify the same row, the database orders them. Once B's
// acquisition has committed, A's publication no longer matches the row, even if B has not
// written anything yet: the acquisition itself is the fence.
//
// # Clocks
//
// Expiry is judged by the database's clock alone, read by the database while the statement
// executes (the README's table says at which moment, per backend). A client
// never compares its clock with a database time. Separately, a holder keeps a trust window on its
// own clock (from the moment it sent the acquire request, ttl minus a safety margin; a clock
// that counts a suspend of the machine: CLOCK_BOOTTIME on Linux) and stops work when it closes
// (Lease.Done), before the database would let anyone else in.
// The trust window makes a holder give up early; it never makes a write acceptable. Only the
// database's conditional statement does that.
//
// # Outcomes
//
// A refusal (*RefusedError, *BusyError) means the database evaluated the condition and changed
// nothing. Its Cause is read afterwards and is advisory. Any other error is operational; for a
// mutation whose request may have reached the database, the outcome is not known.
//
// # What the fence does not cover
//
// Only the payload published through the lease is protected. Anything a build writes elsewhere
// (files, blobs, emails, calls to other services) is not, unless that destination checks the
// token itself. A restore from an older copy of the database, or a failover that loses
// acknowledged commits, can roll generations back. Code that writes the table without these
// statements bypasses the fence.
package fenced
