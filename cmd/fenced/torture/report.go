package torture

import (
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Run describes one torture run for the report.
type Run struct {
	Seed          uint64
	Duration      time.Duration
	Workers       int
	Resources     []string
	Database      string // what was tortured, without credentials
	Unfenced      bool
	Faults        []string          // injected
	NotApplicable map[string]string // fault → why it was not injected
	Plan          []Fault
	Elapsed       time.Duration
}

// Report is a run, its history and the checker's verdict. It is not safe for concurrent use.
type Report struct {
	Run     Run
	History *History
	Result  *Result
}

// FaultCounts counts what the nemesis and the workers actually injected. A restore, restart or
// bump whose event carries an error did not land (or is not known to have): it is counted
// apart, under the fault's name followed by " failed".
func (r *Report) FaultCounts() map[string]int {
	n := map[string]int{}
	for _, e := range r.History.Events {
		switch e.Event {
		case FaultRestore, FaultRestart, FaultBump:
			if e.Err != "" {
				n[e.Event+" failed"]++
			} else {
				n[e.Event]++
			}
		case FaultPause, FaultKill, FaultClock, FaultPartition, FaultLoss, FaultDelay, FaultIsolate:
			n[e.Event]++
		case FaultRowLock:
			if e.Owner != "" { // held across a lease's expiry
				n[e.Event]++
			}
		}
	}
	for _, op := range r.History.Ops {
		if op.Note != "" {
			n[FaultDropReply]++
		}
	}
	return n
}

// IsolatedDelayed lists, by operation and outcome, the requests that an isolated worker sent
// while it was cut off and that were answered after the heal, or never: the delayed requests
// the isolate fault is for ("publish refused 2, renew unknown 1"). Fenced, a publication
// among them is refused, or accepted only when nobody took the lease over meanwhile.
func (r *Report) IsolatedDelayed() string {
	return r.isolated(func(e *Record, op *Op) bool { return op.Return == 0 || op.Return >= e.EndTime })
}

// IsolatedAnswered lists, by operation and outcome, the requests that an isolated worker sent
// while it was cut off and that the database answered (ok, busy, refused, not found) before the
// heal: none when the cut held, since nothing of the worker reached the database meanwhile. A
// cut that did not happen shows here (the worker went on working), where IsolatedDelayed may
// still list the one request in flight at the heal.
func (r *Report) IsolatedAnswered() string {
	return r.isolated(func(e *Record, op *Op) bool {
		return op.Return != 0 && op.Return < e.EndTime && op.Out != OutUnknown && op.Out != OutFailed
	})
}

// isolated counts, by operation and outcome, the requests an isolated worker called while it
// was cut off (isolation e) for which keep holds.
func (r *Report) isolated(keep func(e *Record, op *Op) bool) string {
	n := map[string]int{}
	for i := range r.History.Events {
		e := &r.History.Events[i]
		if e.Event != FaultIsolate {
			continue
		}
		for j := range r.History.Ops {
			op := r.History.Ops[j]
			if op.Proc == e.Proc && op.Call >= e.Time && op.Call < e.EndTime && keep(e, op) {
				n[op.Kind+" "+op.Out]++
			}
		}
	}
	parts := make([]string, 0, len(n))
	for k, c := range n {
		parts = append(parts, fmt.Sprintf("%s %d", k, c))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// killsDuringCall counts, from the history, the kills that left an operation without a reply:
// the killed worker's last CALL, made before the kill, has no RETURN. (The nemesis fires on
// the worker's "call" report, which the worker may outrun to its RETURN before the signal.)
func (r *Report) killsDuringCall() int {
	killed := map[string]int64{} // a killed process's name → when it was killed
	for _, e := range r.History.Events {
		if e.Event == FaultKill {
			killed[e.Proc] = e.Time
		}
	}
	last := map[string]*Op{} // each killed process's last operation
	for _, op := range r.History.Ops {
		if _, ok := killed[op.Proc]; ok && (last[op.Proc] == nil || op.Call >= last[op.Proc].Call) {
			last[op.Proc] = op
		}
	}
	n := 0
	for proc, op := range last {
		if !op.returned && op.Call <= killed[proc] {
			n++
		}
	}
	return n
}

// WriteText writes the plain-text report.
func (r *Report) WriteText(w io.Writer) {
	run, res := r.Run, r.Result
	mode := "fenced (every write is the protocol's conditional statement)"
	if run.Unfenced {
		mode = "UNFENCED: the same acquisitions, then an unconditional write of the payload (a plain lock)"
	}
	fmt.Fprintf(w, "fenced torture: seed %d, %s, %d workers, %d resources, %s\n", run.Seed, run.Duration, run.Workers, len(run.Resources), run.Database)
	fmt.Fprintf(w, "mode: %s\n", mode)
	counts := r.FaultCounts()
	var parts []string
	for _, f := range AllFaults {
		if !contains(run.Faults, f) {
			continue
		}
		s := fmt.Sprintf("%s %d", f, counts[f])
		if f == FaultKill {
			s += fmt.Sprintf(" (%d during an operation)", r.killsDuringCall())
		}
		if failed := counts[f+" failed"]; failed > 0 {
			s += fmt.Sprintf(" (%d more failed)", failed)
		}
		parts = append(parts, s)
	}
	fmt.Fprintf(w, "faults injected: %s\n", orNone(strings.Join(parts, ", ")))
	if contains(run.Faults, FaultIsolate) {
		fmt.Fprintf(w, "  isolate: requests of a cut-off worker sent while cut off and answered after the heal: %s\n", orNone(r.IsolatedDelayed()))
		fmt.Fprintf(w, "  isolate: requests of a cut-off worker answered by the database while cut off: %s\n", orNone(r.IsolatedAnswered()))
	}
	for _, f := range AllFaults {
		if why, ok := run.NotApplicable[f]; ok {
			fmt.Fprintf(w, "  %s: not injected: %s\n", f, why)
		}
	}
	fmt.Fprintf(w, "operations: %d checked, %d with an unknown outcome", res.Ops, res.Unknown)
	if r.History.Truncated > 0 {
		fmt.Fprintf(w, ", %d truncated records ignored", r.History.Truncated)
	}
	fmt.Fprintln(w)
	kinds := make([]string, 0, len(res.Counts))
	for k := range res.Counts {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		outs := make([]string, 0, len(res.Counts[k]))
		for o, n := range res.Counts[k] {
			outs = append(outs, fmt.Sprintf("%s %d", o, n))
		}
		sort.Strings(outs)
		fmt.Fprintf(w, "  %-16s %s\n", k, strings.Join(outs, ", "))
	}
	fmt.Fprintf(w, "checker: %s (direct checks, then the model per resource: a linear search, porcupine where it finds no order)\n", res.Duration.Round(time.Millisecond))
	fmt.Fprintln(w, "invariants:")
	for _, inv := range res.Invariants {
		verdict := "ok      "
		if inv.Violations > 0 {
			verdict = "VIOLATED"
		}
		note := ""
		if inv.Note != "" {
			note = "; " + inv.Note
		}
		fmt.Fprintf(w, "  %s %s (%d checked, %d violations%s)\n", verdict, inv.Name, inv.Checked, inv.Violations, note)
	}
	fmt.Fprintln(w, "not shown by this history:")
	for _, s := range NotShown {
		fmt.Fprintf(w, "  - %s\n", s)
	}
	fmt.Fprintln(w, "The nemesis's choices and the workers' pauses follow from the seed; the interleaving of the processes is the operating system's, so two runs with one seed differ in detail.")
	for i, v := range res.Violations {
		if i == 10 {
			fmt.Fprintf(w, "\n... and %d more violations (see the HTML report)\n", len(res.Violations)-10)
			break
		}
		fmt.Fprintf(w, "\nVIOLATION %d: %s\n  %s: %s\n", i+1, v.Invariant, v.Resource, v.Message)
		r.writeExcerpt(w, v, "  ")
	}
	fmt.Fprintln(w)
	switch {
	case !res.OK():
		fmt.Fprintf(w, "RESULT: %d violations found\n", len(res.Violations))
	case len(res.Inconclusive) > 0:
		fmt.Fprintf(w, "RESULT: no violations found, but the model check did not finish (time or steps) on %s\n", strings.Join(res.Inconclusive, ", "))
	default:
		fmt.Fprintln(w, "RESULT: no violations found")
	}
}

func (r *Report) writeExcerpt(w io.Writer, v Violation, indent string) {
	involved := map[int]bool{}
	for _, i := range v.Involved {
		involved[i] = true
	}
	for _, i := range v.Excerpt {
		mark := "  "
		if involved[i] {
			mark = "=>"
		}
		fmt.Fprintf(w, "%s%s %s\n", indent, mark, r.History.Describe(r.History.Ops[i]))
	}
	if v.More > 0 {
		fmt.Fprintf(w, "%s   ... %d more concurrent operations\n", indent, v.More)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// WriteHTML writes a self-contained page (inline CSS and SVG, nothing fetched) to dir/index.html
// and returns its path.
func (r *Report) WriteHTML(dir string) (string, error) {
	var b strings.Builder
	r.html(&b)
	path := filepath.Join(dir, "index.html")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("write report: %w", err)
	}
	return path, nil
}

// initialFile holds, in a report directory, each resource's state before the workers started:
// what Check needs beside the history to check it again later (ReadInitial).
const initialFile = "initial.json"

// WriteInitial writes init, each resource's state before the run, to dir.
func WriteInitial(dir string, init map[string]State) error {
	b, err := json.MarshalIndent(init, "", "  ")
	if err != nil {
		return fmt.Errorf("write initial states: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, initialFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write initial states: %w", err)
	}
	return nil
}

// ReadInitial reads the states WriteInitial wrote to dir; none (the zero state for every
// resource) when a run older than the file wrote the directory.
func ReadInitial(dir string) (map[string]State, error) {
	b, err := os.ReadFile(filepath.Join(dir, initialFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read initial states: %w", err)
	}
	var init map[string]State
	if err := json.Unmarshal(b, &init); err != nil {
		return nil, fmt.Errorf("read initial states: %w", err)
	}
	return init, nil
}

const css = `body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
.ok{color:#176b2c;font-weight:600}.bad{color:#b00020;font-weight:700}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}
pre.violation{background:#fff0f0;border-left:4px solid #b00020}
table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #eee}
.timeline{overflow-x:auto;border:1px solid #ddd;margin:.5em 0}
.legend span{display:inline-block;margin-right:1em}.sw{display:inline-block;width:12px;height:12px;vertical-align:middle;margin-right:4px}
svg text{font:11px system-ui,sans-serif}`

var colors = map[string]string{
	OpAcquire + OutOK: "#2f6fdf", OpAcquire + OutBusy: "#c8c8c8",
	OpPublish + OutOK: "#1a9e3a", OpPublishRelease + OutOK: "#1a9e3a",
	OpPublish + OutRefused: "#f08c00", OpPublishRelease + OutRefused: "#f08c00",
	OpRenew + OutOK: "#7cc6ff", OpRenew + OutRefused: "#f08c00",
	OpRelease + OutOK: "#0f9c94", OpRelease + OutRefused: "#f0b060",
	OpShow + OutOK: "#888", OpGet + OutOK: "#888", OpGet + OutNotFound: "#aaa",
}

func opColor(op *Op) string {
	if op.Unknown() {
		return "#9b3fd6"
	}
	if c, ok := colors[op.Kind+op.Out]; ok {
		return c
	}
	return "#555"
}

func (r *Report) html(b *strings.Builder) {
	run, res, h := r.Run, r.Result, r.History
	esc := html.EscapeString
	fmt.Fprintf(b, "<!doctype html><html><head><meta charset=\"utf-8\"><title>fenced torture seed %d</title><style>%s</style></head><body>\n", run.Seed, css)
	verdict := `<span class="ok">no violations found</span>`
	if !res.OK() {
		verdict = fmt.Sprintf(`<span class="bad">%d violations found</span>`, len(res.Violations))
	} else if len(res.Inconclusive) > 0 {
		verdict = `<span class="bad">no violations found, but the model check did not finish</span>`
	}
	fmt.Fprintf(b, "<h1>fenced torture — %s</h1>\n", verdict)
	var text strings.Builder
	r.WriteText(&text)
	summary, _, _ := strings.Cut(text.String(), "\nVIOLATION 1:")
	fmt.Fprintf(b, "<pre>%s</pre>\n", esc(strings.TrimSpace(summary)))

	if len(res.Violations) > 0 {
		b.WriteString("<h2>Violations</h2>\n")
		for i, v := range res.Violations {
			if i == 50 {
				fmt.Fprintf(b, "<p>… and %d more.</p>\n", len(res.Violations)-50)
				break
			}
			var ex strings.Builder
			r.writeExcerpt(&ex, v, "")
			fmt.Fprintf(b, "<pre class=\"violation\"><b>%d. %s</b>\n%s: %s\n\n%s</pre>\n", i+1, esc(v.Invariant), esc(v.Resource), esc(v.Message), esc(ex.String()))
		}
	}
	b.WriteString(`<h2>Timelines</h2><p class="legend">`)
	for _, l := range [][2]string{{"#2f6fdf", "acquired"}, {"#c8c8c8", "busy"}, {"#1a9e3a", "publication accepted"},
		{"#f08c00", "refused"}, {"#0f9c94", "released"}, {"#7cc6ff", "renewed"}, {"#888", "read"},
		{"#9b3fd6", "unknown outcome"}, {"rgba(220,0,0,.25)", "paused (SIGSTOP)"}, {"#d00", "✕ killed"},
		{"rgba(240,200,0,.35)", "database restart"}, {"#06c", "clock jump"}} {
		fmt.Fprintf(b, `<span><i class="sw" style="background:%s"></i>%s</span>`, l[0], l[1])
	}
	b.WriteString("</p><p>The top lane of each resource shows its holders: generation and worker, from the acknowledged acquisition to the release, the successor's acquisition, or the nominal expiry (dashed end; the database's clock decides). A red ring marks an operation involved in a violation. Hover for details.</p>\n")
	involved := map[int]bool{}
	for _, v := range res.Violations {
		for _, i := range v.Involved {
			involved[i] = true
		}
	}
	for _, resource := range h.Resources() {
		r.timeline(b, resource, involved)
	}
	b.WriteString("<h2>Nemesis schedule (from the seed)</h2><pre>")
	for _, f := range run.Plan {
		fmt.Fprintln(b, esc(f.String()))
	}
	b.WriteString("</pre><h2>Process and fault events (as they happened)</h2><pre>")
	for _, e := range h.Events {
		end := ""
		if e.EndTime != 0 {
			end = fmt.Sprintf(" → %.3fs", h.Seconds(e.EndTime))
		}
		fmt.Fprintf(b, "%8.3fs%s %s %s %s\n", h.Seconds(e.Time), end, esc(e.Event), esc(e.Proc), esc(e.Detail))
	}
	b.WriteString("</pre></body></html>\n")
}

// timeline draws one resource's SVG.
func (r *Report) timeline(b *strings.Builder, resource string, involved map[int]bool) {
	h := r.History
	var ops []*Op
	lanes := map[string]int{}
	var procs []string
	for _, op := range h.Ops {
		if op.Resource != resource {
			continue
		}
		ops = append(ops, op)
		if _, ok := lanes[op.Proc]; !ok {
			lanes[op.Proc] = 0
			procs = append(procs, op.Proc)
		}
	}
	sort.Strings(procs)
	for i, p := range procs {
		lanes[p] = i + 1 // lane 0 is the holders'
	}
	last := h.Start
	for _, op := range ops {
		if !op.Unknown() {
			last = max(last, op.Return)
		}
	}
	for _, e := range h.Events {
		last = max(last, e.Time, e.EndTime)
	}
	span := float64(last-h.Start)/1e9 + 0.5
	pps := 60.0 // pixels per second
	if span > 120 {
		pps = 25
	}
	const left, laneH, top = 70.0, 22.0, 20.0
	width := left + span*pps + 20
	height := top + float64(len(procs)+1)*laneH + 10
	x := func(t int64) float64 { return left + float64(t-h.Start)/1e9*pps }
	y := func(lane int) float64 { return top + float64(lane)*laneH }
	esc := html.EscapeString
	fmt.Fprintf(b, "<h3>%s</h3><div class=\"timeline\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\">\n", esc(resource), width, height)
	for s := 0; float64(s) <= span; s++ { // a tick per second
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#eee"/><text x="%.1f" y="12" fill="#999">%ds</text>`+"\n",
			x(h.Start+int64(s)*1e9), x(h.Start+int64(s)*1e9), top, height, x(h.Start+int64(s)*1e9)+2, s)
	}
	fmt.Fprintf(b, `<text x="4" y="%.0f" font-weight="bold">holders</text>`+"\n", y(0)+15)
	for _, p := range procs {
		fmt.Fprintf(b, `<text x="4" y="%.0f">%s</text>`+"\n", y(lanes[p])+15, esc(p))
	}
	// Faults: restarts, clock jumps, copies, restores, bumps, partitions, losses and delays span every lane; pauses, kills and isolations sit on their worker's.
	for _, e := range h.Events {
		switch e.Event {
		case FaultRestart:
			fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="rgba(240,200,0,.35)"><title>database restart %s</title></rect>`+"\n",
				x(e.Time), top, max(x(e.EndTime)-x(e.Time), 2), height-top, esc(e.Detail))
		case FaultRestore, "copy", FaultBump, FaultPartition, FaultLoss, FaultDelay:
			label, colour := "restore", "#8a2be2"
			switch e.Event {
			case FaultPartition:
				label, colour = "partition", "#555"
			case FaultLoss: // "loss 30%: …"
				label, _, _ = strings.Cut(e.Detail, ":")
				colour = "#b8860b"
			case FaultDelay: // "latency: …", "stall: …", "reset: …"
				mode, _, _ := strings.Cut(e.Detail, ":")
				label, colour = mode, "#a0522d"
			case "copy":
				label, colour = "copy", "#2e8b57"
			case FaultBump:
				label, colour = fmt.Sprintf("bump → %d", e.Epoch), "#c60"
			}
			fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" fill-opacity=".25"><title>%s %.3fs → %.3fs: %s</title></rect><text x="%.1f" y="%.0f" fill="%s">%s</text>`+"\n",
				x(e.Time), top, max(x(e.EndTime)-x(e.Time), 2), height-top, colour, label, h.Seconds(e.Time), h.Seconds(e.EndTime), esc(e.Detail),
				x(e.Time)+2, height-2, colour, esc(label))
		case FaultClock:
			fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#06c" stroke-dasharray="4 3"><title>database clock offset now %+dms</title></line><text x="%.1f" y="%.0f" fill="#06c">clock %+dms</text>`+"\n",
				x(e.Time), x(e.Time), top, height, e.OffsetMs, x(e.Time)+2, height-2, e.OffsetMs)
		case FaultPause:
			if l, ok := lanes[e.Proc]; ok {
				fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="rgba(220,0,0,.25)"><title>%s paused %.3fs → %.3fs</title></rect>`+"\n",
					x(e.Time), y(l), x(e.EndTime)-x(e.Time), laneH, esc(e.Proc), h.Seconds(e.Time), h.Seconds(e.EndTime))
			}
		case FaultIsolate:
			if l, ok := lanes[e.Proc]; ok {
				fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="rgba(90,90,90,.3)"><title>%s isolated %.3fs → %.3fs: %s</title></rect><text x="%.1f" y="%.0f" fill="#555" font-size="9">isolated</text>`+"\n",
					x(e.Time), y(l), max(x(e.EndTime)-x(e.Time), 2), laneH, esc(e.Proc), h.Seconds(e.Time), h.Seconds(e.EndTime), esc(e.Detail), x(e.Time)+2, y(l)+laneH-3)
			}
		case FaultKill:
			if l, ok := lanes[e.Proc]; ok {
				fmt.Fprintf(b, `<text x="%.1f" y="%.0f" fill="#d00" font-size="16" font-weight="bold">✕<title>%s killed (kill -9) %s</title></text>`+"\n",
					x(e.Time)-5, y(l)+16, esc(e.Proc), esc(e.Detail))
			}
		}
	}
	r.holders(b, ops, x, y(0)+3, laneH-6)
	for _, op := range ops {
		x0 := x(op.Call)
		end := op.Return
		if op.Unknown() {
			end = op.Call + int64(150*time.Millisecond) // drawn short, faded: it may never have happened
		}
		w := max(x(end)-x0, 2)
		yy, hh := y(lanes[op.Proc])+4, laneH-8
		if op.Read() {
			yy, hh = yy+4, hh-8
		}
		opacity := "1"
		if op.Unknown() {
			opacity = ".45"
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" fill-opacity="%s"><title>%s</title></rect>`+"\n",
			x0, yy, w, hh, opColor(op), opacity, esc(h.Describe(op)))
		if (op.Kind == OpPublish || op.Kind == OpPublishRelease) && op.Out == OutOK {
			fmt.Fprintf(b, `<text x="%.1f" y="%.0f" fill="#1a6e2a" font-size="9">g%d</text>`+"\n", x0, yy-1, op.Gen)
		}
		if involved[op.Index] {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.0f" r="9" fill="none" stroke="#d00" stroke-width="3"><title>involved in a violation: %s</title></circle>`+"\n",
				x0+w/2, yy+hh/2, esc(h.Describe(op)))
		}
	}
	b.WriteString("</svg></div>\n")
}

// holders draws who held the resource: from each acknowledged acquisition to its release, the
// next acquisition, or its nominal expiry.
func (r *Report) holders(b *strings.Builder, ops []*Op, x func(int64) float64, y, hgt float64) {
	h := r.History
	var acqs []*Op
	for _, op := range ops {
		if op.Kind == OpAcquire && op.Out == OutOK {
			acqs = append(acqs, op)
		}
	}
	sort.Slice(acqs, func(i, j int) bool { return acqs[i].Gen < acqs[j].Gen })
	for i, a := range acqs {
		end, how := a.Call+a.TTLMs*int64(time.Millisecond), "nominal expiry (TTL after the call; the database's clock decides)"
		dashed := true
		for _, op := range ops {
			if (op.Kind == OpRelease || op.Kind == OpPublishRelease) && op.Out == OutOK && op.Owner == a.Owner && op.Gen == a.Gen && op.Return < end {
				end, how, dashed = op.Return, "released", false
			}
		}
		if i+1 < len(acqs) && acqs[i+1].Return < end {
			end, how, dashed = acqs[i+1].Return, fmt.Sprintf("taken over by generation %d", acqs[i+1].Gen), false
		}
		fill := []string{"#cfe0ff", "#dcecc8"}[a.Gen%2]
		stroke := ""
		if dashed {
			stroke = ` stroke="#2f6fdf" stroke-dasharray="3 2"`
		}
		w := max(x(end)-x(a.Return), 2)
		fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s"%s><title>generation %d held by %s (owner %s) %.3fs → %.3fs: %s</title></rect>`,
			x(a.Return), y, w, hgt, fill, stroke, a.Gen, html.EscapeString(a.Proc), short(a.Owner), h.Seconds(a.Return), h.Seconds(end), how)
		if w > 30 {
			fmt.Fprintf(b, `<text x="%.1f" y="%.0f" font-size="10">g%d %s</text>`, x(a.Return)+2, y+hgt-4, a.Gen, html.EscapeString(a.Proc))
		}
		b.WriteString("\n")
	}
}
