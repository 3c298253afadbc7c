// Package torture is the engine behind "fenced torture": worker processes record every
// operation they send to the database as a CALL before the request and a RETURN after the
// reply, a nemesis injects faults on a schedule derived from a seed, and a checker holds the
// merged history to the protocol's invariants (docs/TORTURE.md, docs/INVARIANTS.md).
//
// The pieces:
//
//   - history.go: the records, written with one write(2) each to an O_APPEND file and stamped
//     with CLOCK_MONOTONIC, which is comparable across processes on one host; Load merges the
//     files into operations. A CALL without a RETURN, or a RETURN carrying an error, is an
//     operation whose outcome is unknown: it may have taken effect at any moment after its call.
//   - worker.go: the loop a worker process runs (acquire, build, publish, release, reads) through
//     a recording driver wrapper, with the drop-reply fault as a driver wrapper beneath it.
//   - schedule.go: the nemesis's plan (pause, kill, restart, clock jumps) derived from the seed.
//   - model.go and check.go: a nondeterministic porcupine model of one resource and direct
//     checks of each invariant a history can show, with the smallest excerpt that shows a
//     violation.
//   - search.go: the linearizability search run on each resource first, linear in a passing
//     history's length and bounded in steps; porcupine confirms and explains a history it
//     finds illegal where no direct check had already flagged the resource.
//   - report.go: the text and HTML reports.
//
// The package lives in the cmd/fenced module so that porcupine stays out of the core.
package torture
