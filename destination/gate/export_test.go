package gate

// Unconditional replaces the check with the statement a naive gate would run: raise the mark
// without comparing it. The mutation test shows the suite's schedules catch it.
func Unconditional(g *Gate) {
	g.stmtMu.Lock()
	defer g.stmtMu.Unlock()
	if g.stmt != nil { // prepared with the real check: prepare the mutant instead
		_ = g.stmt.Close()
		g.stmt = nil
	}
	switch g.d {
	case MySQL:
		g.q.check = `UPDATE ` + DefaultTable + ` SET epoch = ?, generation = ?, checks = checks + 1 WHERE resource = ? AND ? = ? AND ? = ?`
	default:
		g.q.check = `UPDATE ` + DefaultTable + ` SET epoch = $2, generation = $3, checks = checks + 1 WHERE resource = $1`
	}
}
