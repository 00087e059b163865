package bench

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
)

// cellOrder is the seed's row order.
var cellOrder = []string{"Sync/Sync", "Sync/Async", "Async/Sync", "Async/Async", "Disabled/Sync", "Disabled/Async"}

func cellRank(label string) int {
	for i, c := range cellOrder {
		if c == label {
			return i
		}
	}
	return len(cellOrder)
}

// group is the rows of one workload and codec.
type group struct {
	workload, codec string
	rows            []Row
}

func groups(rows []Row) []group {
	var gs []group
	idx := map[[2]string]int{}
	for _, r := range rows {
		k := [2]string{r.Workload, r.Codec}
		i, ok := idx[k]
		if !ok {
			i = len(gs)
			idx[k] = i
			gs = append(gs, group{workload: r.Workload, codec: r.Codec})
		}
		gs[i].rows = append(gs[i].rows, r)
	}
	for _, g := range gs {
		sort.SliceStable(g.rows, func(i, j int) bool { return cellRank(g.rows[i].Label()) < cellRank(g.rows[j].Label()) })
	}
	return gs
}

// WriteTable prints rows in the seed's shape, one table per workload and
// codec, with a ratio to Disabled/Sync when that cell ran, then the codec
// gap per cell when more than one codec ran.
func WriteTable(w io.Writer, rows []Row) error {
	gs := groups(rows)
	for gi, g := range gs {
		if gi > 0 {
			fmt.Fprintln(w)
		}
		r0 := g.rows[0]
		reads := "reads wait for acknowledgement"
		if r0.SpeculativeReads {
			reads = "speculative read-modify-write reads"
		}
		mode := r0.Mode + placedAs(r0)
		rounds := ""
		if n := len(r0.Runs); n > 1 {
			rounds = fmt.Sprintf("; medians of %d rounds, ratios paired by round", n)
		}
		terminals := fmt.Sprintf("%d terminals", r0.Terminals)
		if r0.Pipeline > 0 {
			terminals += fmt.Sprintf(" pipelining %d each", r0.Pipeline)
		}
		fmt.Fprintf(w, "%s, %s, %s, %gs measured (%s cluster, %d replicas when replicating, %s%s)\n\n",
			strings.ToUpper(g.workload), g.codec, terminals, r0.DurationS, mode, maxReplicas(g.rows), reads, rounds)
		var base *Row
		for i, r := range g.rows {
			if r.Label() == "Disabled/Sync" {
				base = &g.rows[i]
			}
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		// CPU per commit and cores busy sit beside the throughput because,
		// on a machine where the replicas share the primary's cores, a run
		// near the core count is CPU-bound and its ratios follow the CPU.
		fmt.Fprintln(tw, "Replication\tDurability\tReqs per second\trounds\tvs Disabled/Sync\tp50 ms\tp99 ms\taborts\tretries\tlag p99 s\tlag p99 recs\tWAL MB/s\ttxn/batch\tfsync ms\tCPU ms/1k commits\tCPU cores\tconsistent\t")
		for _, r := range g.rows {
			vs := "-"
			if base != nil {
				if x, ok := Ratio(r, *base); ok {
					vs = fmt.Sprintf("%.2fx", x)
				}
			}
			cpu, cores := "-", "-"
			if r.CPUMsPer1000 > 0 {
				cpu = fmt.Sprintf("%.0f", r.CPUMsPer1000)
			}
			if r.CPUCores > 0 {
				cores = fmt.Sprintf("%.2f", r.CPUCores)
			}
			group, fsync := "-", "-"
			if r.CommitsPerBatch > 0 {
				group = fmt.Sprintf("%.1f", r.CommitsPerBatch)
			}
			if r.FsyncMs > 0 {
				fsync = fmt.Sprintf("%.2f", r.FsyncMs)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%s\t%.2f\t%.2f\t%d\t%d\t%.3f\t%.0f\t%.2f\t%s\t%s\t%s\t%s\t%v\t\n",
				r.Replication, r.Durability, r.TxnPerS, spread(r), vs, r.P50Ms, r.P99Ms, r.Aborts, r.Retries, r.ReplicaLagP99S, r.ReplicaLagP99Records, r.WALMBPerS, group, fsync, cpu, cores, r.Consistent)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, r := range g.rows {
			if !r.Consistent || r.Errors > 0 {
				fmt.Fprintf(w, "  %s: %s\n", r.Label(), rowProblems(r))
			}
		}
		for _, r := range g.rows {
			if r.CPUUsPerRequest > 0 {
				fmt.Fprintf(w, "  %s CPU per request: %s\n", r.Label(), formatPerRequest(r))
			}
		}
		for _, r := range g.rows {
			if len(r.PrimaryCPUShares) > 0 {
				fmt.Fprintf(w, "  %s primary CPU: %s\n", r.Label(), formatShares(r.PrimaryCPUShares))
			}
		}
		for _, r := range g.rows {
			if r.ArchiveLagMaxS > 0 || r.ArchiveLagP99S > 0 {
				fmt.Fprintf(w, "  %s archive lag: p99 %.2f s, max %.2f s\n", r.Label(), r.ArchiveLagP99S, r.ArchiveLagMaxS)
			}
		}
	}
	return writeCodecGap(w, rows)
}

// placedAs says where r's nodes ran, for the table's title: apart (the
// headline placement), deprioritised, or on the same cores.
func placedAs(r Row) string {
	if r.Mode == ModeExternal {
		return ""
	}
	var placed []string
	if r.PrimaryCPUs != "" {
		placed = append(placed, "primary and clients on CPUs "+r.PrimaryCPUs)
	}
	var peers []string
	switch {
	case r.ReplicaIdle:
		peers = append(peers, "at SCHED_IDLE")
	case r.ReplicaNice != 0:
		peers = append(peers, fmt.Sprintf("at nice %d", r.ReplicaNice))
	}
	if r.ReplicaCPUs != "" {
		peers = append(peers, "on CPUs "+r.ReplicaCPUs)
	}
	if len(peers) > 0 {
		placed = append(placed, "log store and replicas "+strings.Join(peers, ", "))
	}
	if len(placed) == 0 || r.Mode == ModeInProcess {
		return " (every node and the clients on the same cores)"
	}
	return " (" + strings.Join(placed, "; ") + ")"
}

// Ratio is r's throughput relative to base's. For rows of rounds (Runs of
// equal length, run i of each from round i) it is the median of the
// per-round ratios, which cancels the drift of a shared machine between
// rounds — the two runs of a round are minutes apart at most, the rounds of
// a matrix half an hour; otherwise the ratio of the two rows' throughputs.
// ok is false when base has no throughput.
func Ratio(r, base Row) (x float64, ok bool) {
	return pairedRatio(r.Runs, base.Runs, r.TxnPerS, base.TxnPerS)
}

// CPURatio is r's primary CPU per commit relative to base's, paired by
// round as Ratio is.
func CPURatio(r, base Row) (x float64, ok bool) {
	return pairedRatio(r.CPURuns, base.CPURuns, r.CPUMsPer1000, base.CPUMsPer1000)
}

// pairedRatio is the median of xs[i]/bases[i] when both hold the same
// rounds, else x/base; ok is false when a divisor is not positive.
func pairedRatio(xs, bases []float64, x, base float64) (float64, bool) {
	if n := len(xs); n > 1 && n == len(bases) {
		rs := make([]float64, n)
		for i := range rs {
			if bases[i] <= 0 {
				return 0, false
			}
			rs[i] = xs[i] / bases[i]
		}
		return medianOf(rs), true
	}
	if base <= 0 {
		return 0, false
	}
	return x / base, true
}

// spread is the range of a median row's rounds ("lowest-highest" txn/s),
// "-" for a single run.
func spread(r Row) string {
	if len(r.Runs) < 2 {
		return "-"
	}
	return fmt.Sprintf("%.0f-%.0f", slices.Min(r.Runs), slices.Max(r.Runs))
}

func maxReplicas(rows []Row) int {
	n := 0
	for _, r := range rows {
		n = max(n, r.Replicas)
	}
	return n
}

func rowProblems(r Row) string {
	var ps []string
	for _, n := range r.Nodes {
		for _, v := range n.Violations {
			ps = append(ps, n.Node+": "+v)
		}
	}
	if r.Notes != "" {
		ps = append(ps, r.Notes)
	}
	return strings.Join(ps, "; ")
}

// writeCodecGap prints, per workload, each cell's txn/s per codec and the
// ratio of the first codec to the second (msgpack/json; paired by round,
// see Ratio).
func writeCodecGap(w io.Writer, rows []Row) error {
	var codecs []string
	seen := map[string]bool{}
	for _, r := range rows {
		if !seen[r.Codec] {
			seen[r.Codec] = true
			codecs = append(codecs, r.Codec)
		}
	}
	if len(codecs) < 2 {
		return nil
	}
	var workloads []string
	byCell := map[string]map[string]Row{}
	for _, r := range rows {
		k := r.Workload + "\x00" + r.Label()
		if byCell[k] == nil {
			byCell[k] = map[string]Row{}
			if !contains(workloads, r.Workload) {
				workloads = append(workloads, r.Workload)
			}
		}
		byCell[k][r.Codec] = r
	}
	for _, wl := range workloads {
		fmt.Fprintf(w, "\n%s codec gap (txn/s)\n\n", strings.ToUpper(wl))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "Replication\tDurability\t%s\t%s/%s\t\n", strings.Join(codecs, "\t"), codecs[0], codecs[1])
		for _, cell := range cellOrder {
			m := byCell[wl+"\x00"+cell]
			if m == nil {
				continue
			}
			parts := strings.SplitN(cell, "/", 2)
			fmt.Fprintf(tw, "%s\t%s\t", parts[0], parts[1])
			for _, c := range codecs {
				fmt.Fprintf(tw, "%.1f\t", m[c].TxnPerS)
			}
			gap := "-"
			if x, ok := Ratio(m[codecs[0]], m[codecs[1]]); ok {
				gap = fmt.Sprintf("%.2fx", x)
			}
			fmt.Fprintf(tw, "%s\t\n", gap)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// WriteJSON writes rows as an indented JSON list.
func WriteJSON(w io.Writer, rows []Row) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if rows == nil {
		rows = []Row{}
	}
	return enc.Encode(rows)
}

// ReadJSON reads what WriteJSON wrote.
func ReadJSON(r io.Reader) ([]Row, error) {
	var rows []Row
	err := json.NewDecoder(r).Decode(&rows)
	return rows, err
}

// WriteSVG draws throughput per cell as grouped bars (one bar per codec),
// one panel per workload, as a standalone SVG document.
func WriteSVG(w io.Writer, rows []Row) error {
	var workloads, codecs []string
	for _, r := range rows {
		if !contains(workloads, r.Workload) {
			workloads = append(workloads, r.Workload)
		}
		if !contains(codecs, r.Codec) {
			codecs = append(codecs, r.Codec)
		}
	}
	const (
		panelW, panelH   = 760, 300
		left, right, top = 70, 20, 50
		bottom           = 60
		width            = panelW
	)
	colors := []string{"#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951"}
	height := len(workloads)*(panelH+top) + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">walship bench: throughput per Replication/Durability cell and codec</text>`+"\n", left)
	for pi, wl := range workloads {
		y0 := 40 + pi*(panelH+top)
		plotTop, plotBottom := y0+top, y0+panelH+top-bottom
		plotH := float64(plotBottom - plotTop)
		var cells []string
		vals := map[string]map[string]float64{}
		peak := 0.0
		for _, r := range rows {
			if r.Workload != wl {
				continue
			}
			if vals[r.Label()] == nil {
				vals[r.Label()] = map[string]float64{}
				cells = append(cells, r.Label())
			}
			vals[r.Label()][r.Codec] = r.TxnPerS
			peak = max(peak, r.TxnPerS)
		}
		sort.SliceStable(cells, func(i, j int) bool { return cellRank(cells[i]) < cellRank(cells[j]) })
		step := niceStep(peak / 5)
		ymax := math.Max(step, math.Ceil(peak/step)*step)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", left, y0+top-20, html.EscapeString(strings.ToUpper(wl)))
		// Y axis with ticks and grid.
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, plotTop, left, plotBottom)
		for v := 0.0; v <= ymax+step/2; v += step {
			y := float64(plotBottom) - v/ymax*plotH
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, panelW-right, y)
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, fmtTick(v))
		}
		fmt.Fprintf(&b, `<text transform="translate(16,%d) rotate(-90)" text-anchor="middle">txn/s</text>`+"\n", (plotTop+plotBottom)/2)
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, plotBottom, panelW-right, plotBottom)
		if len(cells) > 0 {
			slot := float64(panelW-right-left) / float64(len(cells))
			barW := slot * 0.8 / float64(len(codecs))
			for ci, cell := range cells {
				x0 := float64(left) + float64(ci)*slot + slot*0.1
				for k, c := range codecs {
					v, ok := vals[cell][c]
					if !ok {
						continue
					}
					h := v / ymax * plotH
					x := x0 + float64(k)*barW
					fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s %s: %.1f txn/s</title></rect>`+"\n",
						x, float64(plotBottom)-h, barW-2, h, colors[k%len(colors)], html.EscapeString(wl), html.EscapeString(cell), html.EscapeString(c), v)
					fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%.0f</text>`+"\n", x+barW/2-1, float64(plotBottom)-h-3, v)
				}
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(left)+float64(ci)*slot+slot/2, plotBottom+18, html.EscapeString(cell))
			}
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">Replication/Durability</text>`+"\n", (left+panelW-right)/2, plotBottom+38)
		// Legend.
		for k, c := range codecs {
			x := panelW - right - 110*(len(codecs)-k)
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, y0+top-30, colors[k%len(colors)], x+16, y0+top-20, html.EscapeString(c))
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func fmtTick(v float64) string {
	if v >= 1000 && math.Mod(v, 1000) == 0 {
		return fmt.Sprintf("%gk", v/1000)
	}
	return fmt.Sprintf("%g", v)
}

// formatPerRequest says what one request cost in CPU: the CPU scope's
// (the primary's with --processes) and, when known, the client's.
func formatPerRequest(r Row) string {
	who := r.CPUScope
	if r.Mode == ModeProcesses {
		who = "primary"
	}
	out := fmt.Sprintf("%s %.1f µs", who, r.CPUUsPerRequest)
	if r.ClientCPUUsPerRequest > 0 {
		out += fmt.Sprintf(", client %.1f µs", r.ClientCPUUsPerRequest)
	}
	if r.PeersCPUUsPerRequest > 0 {
		out += fmt.Sprintf(", log store and replicas %.1f µs", r.PeersCPUUsPerRequest)
	}
	if r.Pipeline > 0 {
		out += fmt.Sprintf(" (pipelined, %d in flight per terminal)", r.Pipeline)
	}
	return out
}
