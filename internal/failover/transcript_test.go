package failover

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/walship/walship/internal/datadir"
)

// TestTranscripts runs testdata/*.txt: message-level transcripts of the
// acceptor, the quorum rule and the node's run loop. Each command prints
// the decision and, for the acceptor, the effects and the state once they
// are persisted (a refused message changes nothing).
//
// Commands:
//
//	state [vote=E] [primary=ID] [addr=A] [log-epoch=E] [cluster=C]
//	fence epoch=E candidate=ID [addr=A] [cluster=C]
//	heartbeat epoch=E [primary=ID] [addr=A] [cluster=C] [bound=jump]
//	entries sender=E            input: "epoch first last" per batch
//	stream                      a new Append stream (no epoch declared)
//	append [hb=E] [primary=ID] [addr=A] [cluster=C] [batch=E,FIRST,LAST]
//	       [truncate=LSN] last=LSN [differs=WHY]
//	opens epoch=E candidate=ID
//	next-epoch seen=E
//	judge members=..,.. logstores=..,.. k=K [ls-sync] [prev=ID]
//	                            input: "id epoch lsn [logstore] [refused]
//	                            [primary-last=L] [primary-durable=D]"
//	node [from=STATE]           input: one event per line
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var h harness
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := h.run(d)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			return out
		})
	})
}

type harness struct {
	s       State
	sender  uint64
	fencing bool // the step is a fence's
}

func epochArg(v string) (uint64, error) {
	switch {
	case v == "max":
		return datadir.MaxEpoch, nil
	case strings.HasPrefix(v, "max-"):
		n, err := strconv.ParseUint(strings.TrimPrefix(v, "max-"), 10, 64)
		return datadir.MaxEpoch - n, err
	case v == "max+1":
		return datadir.MaxEpoch + 1, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

type args map[string]string

func argsOf(d *datadriven.TestData) args {
	a := args{}
	for _, c := range d.CmdArgs {
		a[c.Key] = strings.Join(c.Vals, ",")
	}
	return a
}

func (a args) epoch(k string) (uint64, error) {
	v, ok := a[k]
	if !ok {
		return 0, nil
	}
	return epochArg(v)
}

func (h *harness) run(d *datadriven.TestData) (string, error) {
	a := argsOf(d)
	var b strings.Builder
	switch d.Cmd {
	case "state":
		e, err := a.epoch("vote")
		if err != nil {
			return "", err
		}
		le, err := a.epoch("log-epoch")
		if err != nil {
			return "", err
		}
		h.s = State{Vote: datadir.Vote{Epoch: e, Primary: a["primary"], Addr: a["addr"]}, LogEpoch: le, Cluster: a["cluster"]}
		h.sender = 0
		writeState(&b, h.s)
	case "fence":
		e, err := a.epoch("epoch")
		if err != nil {
			return "", err
		}
		st := h.s.Fence(Fence{Epoch: e, Candidate: a["candidate"], Addr: a["addr"], Cluster: a["cluster"]})
		if st.Refused == nil && !st.Granted {
			fmt.Fprintf(&b, "not granted: the promise is %v\n", st.Next.Vote)
		}
		h.fencing = true
		h.step(&b, st)
		h.fencing = false
	case "heartbeat":
		e, err := a.epoch("epoch")
		if err != nil {
			return "", err
		}
		hb := Heartbeat{Epoch: e, Primary: a["primary"], Addr: a["addr"], Cluster: a["cluster"]}
		if a["bound"] == "jump" {
			hb.Bound = datadir.MaxEpochJump
		}
		h.step(&b, h.s.Heartbeat(hb))
	case "echo-now":
		e, err := a.epoch("epoch")
		if err != nil {
			return "", err
		}
		admitted, err := a.epoch("admitted")
		if err != nil {
			return "", err
		}
		hb := Heartbeat{Epoch: e, Primary: a["primary"], Addr: a["addr"], Cluster: a["cluster"]}
		fmt.Fprintf(&b, "echo now: %v\n", h.s.EchoNow(hb, admitted))
	case "entries":
		sender, err := a.epoch("sender")
		if err != nil {
			return "", err
		}
		var es []Entry
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			var e Entry
			if _, err := fmt.Sscan(line, &e.Epoch, &e.FirstLSN, &e.LastLSN); err != nil {
				return "", fmt.Errorf("entry %q: %w", line, err)
			}
			es = append(es, e)
		}
		h.step(&b, h.s.Entries(sender, es))
	case "stream":
		h.sender = 0
		b.WriteString("ok\n")
	case "append":
		m := Append{Sender: h.sender, Differs: a["differs"]}
		if _, ok := a["hb"]; ok {
			e, err := a.epoch("hb")
			if err != nil {
				return "", err
			}
			m.HB = &Heartbeat{Epoch: e, Primary: a["primary"], Addr: a["addr"], Cluster: a["cluster"]}
		}
		if v, ok := a["batch"]; ok {
			var e Entry
			if _, err := fmt.Sscanf(v, "%d,%d,%d", &e.Epoch, &e.FirstLSN, &e.LastLSN); err != nil {
				return "", fmt.Errorf("batch=%s: %w", v, err)
			}
			m.Batch = &e
		}
		if v, ok := a["truncate"]; ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return "", err
			}
			m.Truncate, m.TruncateAfter = true, n
		}
		last, err := a.epoch("last")
		if err != nil {
			return "", err
		}
		m.Last = last
		as := h.s.Append(m)
		if as.Refused == nil || as.Refused.Reason != OtherCluster {
			h.sender = as.Sender
		}
		if as.Store {
			b.WriteString("store\n")
		}
		if as.Why != "" {
			fmt.Fprintf(&b, "why: %s\n", as.Why)
		}
		h.step(&b, as.Step)
		fmt.Fprintf(&b, "stream sender epoch %d\n", h.sender)
	case "opens":
		e, err := a.epoch("epoch")
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%v\n", h.s.Opens(e, a["candidate"]))
	case "next-epoch":
		seen, err := a.epoch("seen")
		if err != nil {
			return "", err
		}
		e, err := datadir.NextEpoch(seen)
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
		} else {
			fmt.Fprintf(&b, "%d\n", e)
		}
	case "judge":
		return h.judge(d, a)
	case "node":
		s := Replica
		if f, ok := a["from"]; ok {
			s = 0
			for k, n := range nodeStateNames {
				if n == f {
					s = k
				}
			}
			if s == 0 {
				return "", fmt.Errorf("no state %q", f)
			}
		}
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			var e NodeEvent
			for k, n := range nodeEventNames {
				if n == line {
					e = k
				}
			}
			if e == 0 {
				return "", fmt.Errorf("no event %q", line)
			}
			next, ok := Transition(s, e)
			if ok {
				fmt.Fprintf(&b, "%v --%v--> %v\n", s, e, next)
			} else {
				fmt.Fprintf(&b, "%v --%v--> (cannot happen)\n", s, e)
			}
			s = next
		}
	default:
		return "", fmt.Errorf("unknown command %q", d.Cmd)
	}
	return b.String(), nil
}

// step prints st and, unless it was refused, adopts its next state (its
// effects are taken as persisted).
func (h *harness) step(b *strings.Builder, st Step) {
	if st.Refused != nil {
		fmt.Fprintf(b, "refused: %v\n", st.Refused)
		if len(st.Effects) != 0 {
			fmt.Fprintf(b, "BUG: a refusal with effects %v\n", st.Effects)
		}
		if st.Next != h.s {
			fmt.Fprintf(b, "BUG: a refusal changed the state\n")
		}
		return
	}
	if st.Granted {
		b.WriteString("granted\n")
	}
	for _, e := range st.Effects {
		switch e := e.(type) {
		case SaveVote:
			fmt.Fprintf(b, "effect: save vote %v (%s)\n", e.Vote, e.Why)
		case AdoptCluster:
			fmt.Fprintf(b, "effect: adopt cluster %s from %s\n", e.ID, e.From)
		case NoteEpoch:
			fmt.Fprintf(b, "effect: note epoch %d from LSN %d\n", e.Epoch, e.FirstLSN)
		case CutAfter:
			fmt.Fprintf(b, "effect: cut after LSN %d (into an orphan file)\n", e.LSN)
		}
	}
	h.check(b, st.Next)
	h.s = st.Next
	writeState(b, h.s)
}

// check prints any invariant st breaks against the state before it.
func (h *harness) check(b *strings.Builder, next State) {
	if next.Vote.Epoch < h.s.Vote.Epoch {
		fmt.Fprintf(b, "BUG (I1): the promise went down from %d to %d\n", h.s.Vote.Epoch, next.Vote.Epoch)
	}
	if next.LogEpoch > next.Vote.Epoch {
		fmt.Fprintf(b, "BUG (I2): the log's epoch %d is above the promise %d\n", next.LogEpoch, next.Vote.Epoch)
	}
	if h.s.Cluster != "" && next.Cluster != h.s.Cluster {
		fmt.Fprintf(b, "BUG (I8): the cluster changed from %s to %s\n", h.s.Cluster, next.Cluster)
	}
	if h.fencing && next.Vote.Epoch == h.s.Vote.Epoch && h.s.Vote.Primary != "" && next.Vote.Primary != h.s.Vote.Primary {
		fmt.Fprintf(b, "BUG (I4): epoch %d granted to %s, then to %s\n", next.Vote.Epoch, h.s.Vote.Primary, next.Vote.Primary)
	}
}

func writeState(b *strings.Builder, s State) {
	c := s.Cluster
	if c == "" {
		c = "none"
	}
	fmt.Fprintf(b, "state: promise %v, log epoch %d, cluster %s\n", s.Vote, s.LogEpoch, c)
}

func (h *harness) judge(d *datadriven.TestData, a args) (string, error) {
	split := func(v string) []string {
		if v == "" {
			return nil
		}
		return strings.Split(v, ",")
	}
	c := Contract{Members: split(a["members"]), LogStores: split(a["logstores"])}
	if _, ok := a["ls-sync"]; ok {
		c.LogStoreSync = true
	}
	if v, ok := a["k"]; ok {
		k, err := strconv.Atoi(v)
		if err != nil {
			return "", err
		}
		c.K = k
	}
	var all, counted []Answer
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			return "", fmt.Errorf("answer %q: want id epoch lsn ...", line)
		}
		an := Answer{ID: f[0]}
		var err error
		if an.LastEpoch, err = strconv.ParseUint(f[1], 10, 64); err != nil {
			return "", err
		}
		if an.LastLSN, err = strconv.ParseUint(f[2], 10, 64); err != nil {
			return "", err
		}
		counts := true
		for _, o := range f[3:] {
			k, v, _ := strings.Cut(o, "=")
			switch k {
			case "logstore":
				an.LogStore = true
			case "refused":
				counts = false
			case "primary-last":
				an.PrimaryLast, err = strconv.ParseUint(v, 10, 64)
			case "primary-durable":
				an.PrimaryDurable, err = strconv.ParseUint(v, 10, 64)
			default:
				return "", fmt.Errorf("answer %q: unknown %q", line, o)
			}
			if err != nil {
				return "", err
			}
		}
		all = append(all, an)
		if counts {
			counted = append(counted, an)
		}
	}
	v := Judge(c, a["prev"], counted, all)
	var b strings.Builder
	fmt.Fprintf(&b, "quorum %v: %d of %d log stores (need %d), %d of %d members (need %d)\n",
		v.Quorum, v.LogStores, len(c.LogStores), v.NeedLogStores, v.Members, v.Eligible, v.NeedMembers)
	if v.Donor >= 0 {
		dn := counted[v.Donor]
		fmt.Fprintf(&b, "donor %s (epoch %d, LSN %d)\n", dn.ID, dn.LastEpoch, dn.LastLSN)
	}
	if v.AtRisk != [2]uint64{} {
		fmt.Fprintf(&b, "at risk: LSNs %d..%d", v.AtRisk[0], v.AtRisk[1])
		if v.AtRiskDurable != 0 {
			fmt.Fprintf(&b, ", fsynced by the old primary up to %d", v.AtRiskDurable)
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}
