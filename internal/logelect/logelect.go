// Package logelect is automatic failover's election held on the log
// stores themselves (`walship node --auto-failover`): no Kubernetes, etcd
// or other coordinator, only the majority quorum that already grants
// epochs.
//
// Each log store keeps a register (failover.Register, EpochService.Elect):
// the holder, its term, and whether automatic failover is paused. A node
// holds the election when a majority granted it a term; it renews at
// every log store each RetryPeriod, and each log store judges it alive
// while renewals arrive within LeaseDuration on its own clock. No clock is
// compared across machines: [Client.Held] turns false RenewDeadline after
// the START of the last renewal a majority granted, and a log store can
// grant another node only LeaseDuration after it RECEIVED that renewal,
// which is later; hence RenewDeadline < LeaseDuration, with a margin for
// clock rates.
//
// Like the Kubernetes Lease it replaces, the election is no fence: the
// epoch vote is. It decides who may try to become primary, so a replica
// that cannot reach the primary, while a majority of log stores still
// hear the primary renew, cannot win it, and two replicas that both see
// the primary die cannot both promote themselves at once.
package logelect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/internal/watermark"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The defaults. A dead primary's register is free LeaseDuration after its
// last renewal reached the log stores; the promotion that follows waits
// out the primary's own write lease (--lease-timeout, 1 s) from its last
// contact with them, so a shorter election lease would gain nothing, and
// a longer one would add to every failover. A primary that has not renewed
// for RenewDeadline stops taking writes (availability, never safety).
const (
	DefaultLeaseDuration = time.Second
	DefaultRenewDeadline = 700 * time.Millisecond
	DefaultRetryPeriod   = 150 * time.Millisecond
)

// Config configures a node's election client.
type Config struct {
	// ID is the node's id ("" for an operator's client, which only reads
	// and pauses).
	ID string
	// LogStores are the log store addresses; a majority of them decides.
	LogStores []string
	// LeaseDuration, RenewDeadline and RetryPeriod: see the package doc.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Logger receives the election's logs; nil discards them.
	Logger *slog.Logger
	// Dialer is the identity the node dials the log stores with.
	Dialer serve.Dialer
}

// Validate checks c, naming the flag of what is wrong.
func (c Config) Validate() error {
	var errs []error
	if len(c.LogStores) == 0 {
		errs = append(errs, errors.New("--logstore: automatic failover needs the log stores (it is held on them)"))
	}
	if c.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--election-retry-period: %v is not positive", c.RetryPeriod))
	}
	if c.LeaseDuration <= 0 || c.LeaseDuration > time.Minute {
		errs = append(errs, fmt.Errorf("--election-lease: %v is not in (0, 1m]", c.LeaseDuration))
	}
	if c.RenewDeadline < 2*c.RetryPeriod {
		errs = append(errs, fmt.Errorf("--election-renew-deadline: %v is less than 2 × --election-retry-period (%v): one slow renewal would stop the primary", c.RenewDeadline, c.RetryPeriod))
	}
	if max := c.LeaseDuration * 9 / 10; c.RenewDeadline > max {
		errs = append(errs, fmt.Errorf("--election-renew-deadline: %v exceeds 0.9 × --election-lease = %v: a primary could take writes after a log store frees the election", c.RenewDeadline, max))
	}
	return errors.Join(errs...)
}

// View is what the log stores last said of the election.
type View struct {
	// Holder and Term: the register with the newest term among the answers.
	Holder string
	Term   uint64
	// AliveAt is how many log stores judge their holder alive; Reached
	// how many answered, of Stores.
	AliveAt, Reached, Stores int
	// Alive: so many log stores judge the holder alive that no campaign
	// can gather a majority.
	Alive bool
	// Paused: automatic failover is paused (the newest pause state seen).
	Paused bool
	// PauseVersion numbers that pause state.
	PauseVersion uint64
}

// Outcome is the last thing the election did on this node.
type Outcome struct {
	What string
	At   time.Time
}

// Client is one node's part in the election.
type Client struct {
	cfg     Config
	logger  *slog.Logger
	conns   []*grpc.ClientConn
	clients []walshipv1.EpochServiceClient

	mu           sync.Mutex
	heldUntil    time.Time           // monotonic
	renewals     watermark.Watermark // the grants that moved heldUntil on, for Renewed
	term         uint64              // the term this node holds or last held
	pauseVersion uint64              // the newest pause state seen
	paused       bool
	view         View
	outcome      Outcome
}

// New makes a client (the connections are made lazily).
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{cfg: cfg, logger: cfg.Logger}
	for _, addr := range cfg.LogStores {
		cc, err := cfg.Dialer.Dial(addr, cfg.Dialer.PeerClass(tlsid.ClassLogStore))
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("--logstore %s: %w", addr, err)
		}
		c.conns = append(c.conns, cc)
		c.clients = append(c.clients, walshipv1.NewEpochServiceClient(cc))
	}
	return c, nil
}

// Close closes the connections.
func (c *Client) Close() error {
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// majority is the log-store majority, the quorum rule of internal/failover.
func (c *Client) majority() int { return failover.Majority(len(c.cfg.LogStores)) }

// answer is one log store's reply.
type answer struct {
	resp *walshipv1.ElectResponse
	err  error
}

// send asks every log store in parallel, and returns once enough says the
// answers so far are enough, every log store answered, or timeout passed.
// The calls still out end with the timeout.
func (c *Client) send(ctx context.Context, req *walshipv1.ElectRequest, timeout time.Duration, enough func([]answer) bool) []answer {
	c.mu.Lock()
	req.PauseVersion, req.Paused = c.pauseVersion, c.paused
	c.mu.Unlock()
	if req.Op != walshipv1.ElectOp_ELECT_OP_READ && req.Op != walshipv1.ElectOp_ELECT_OP_RELEASE {
		req.Lease = durationpb.New(c.cfg.LeaseDuration)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	ch := make(chan answer, len(c.clients))
	for _, cl := range c.clients {
		go func() {
			resp, err := cl.Elect(cctx, req)
			ch <- answer{resp, err}
		}()
	}
	var got []answer
	for range c.clients {
		a := <-ch
		got = append(got, a)
		if enough != nil && enough(got) {
			break
		}
	}
	if rest := len(c.clients) - len(got); rest > 0 {
		// The calls still out go on until the timeout: a renewal the
		// caller no longer waits for still keeps that log store's lease.
		go func() {
			defer cancel()
			for range rest {
				<-ch
			}
		}()
	} else {
		cancel()
	}
	c.learn(got)
	return got
}

// learn takes the newest pause state and the view from answers.
func (c *Client) learn(got []answer) {
	v := View{Stores: len(c.clients)}
	for _, a := range got {
		if a.err != nil {
			continue
		}
		r := a.resp
		v.Reached++
		if r.GetAlive() {
			v.AliveAt++
		}
		if r.GetTerm() > v.Term || v.Holder == "" {
			v.Holder, v.Term = r.GetHolderId(), r.GetTerm()
		}
		if r.GetPauseVersion() > v.PauseVersion {
			v.PauseVersion, v.Paused = r.GetPauseVersion(), r.GetPaused()
		}
	}
	v.Alive = v.AliveAt > v.Stores-c.majority()
	c.mu.Lock()
	defer c.mu.Unlock()
	if v.PauseVersion > c.pauseVersion {
		c.pauseVersion, c.paused = v.PauseVersion, v.Paused
	}
	v.PauseVersion, v.Paused = c.pauseVersion, c.paused
	if v.Reached > 0 {
		c.view = v
	}
}

func granted(as []answer) int {
	n := 0
	for _, a := range as {
		if a.err == nil && a.resp.GetGranted() {
			n++
		}
	}
	return n
}

// why summarises the refusals in as.
func why(as []answer) string {
	for _, a := range as {
		switch {
		case a.err != nil:
			return a.err.Error()
		case !a.resp.GetGranted():
			return a.resp.GetId() + ": " + a.resp.GetWhy()
		}
	}
	return "no log store answered"
}

// Read asks every log store for its register: the view of the election.
// It fails when no majority answered.
func (c *Client) Read(ctx context.Context) (View, error) {
	as := c.send(ctx, &walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_READ}, c.cfg.RenewDeadline, nil)
	c.mu.Lock()
	v := c.view
	c.mu.Unlock()
	if n := len(as) - errs(as); n < c.majority() {
		return v, fmt.Errorf("%d of %d log stores answered, %d needed: %s", n, len(as), c.majority(), why(as))
	}
	return v, nil
}

func errs(as []answer) int {
	n := 0
	for _, a := range as {
		if a.err != nil {
			n++
		}
	}
	return n
}

// LastView is the view of the last read, renewal or campaign.
func (c *Client) LastView() View {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.view
}

// LastOutcome is the last thing the election did on this node.
func (c *Client) LastOutcome() Outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outcome
}

func (c *Client) note(format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	c.mu.Lock()
	c.outcome = Outcome{What: what, At: time.Now()}
	c.mu.Unlock()
}

// Held reports whether this node holds the election now: within
// RenewDeadline of the start of the last acquisition or renewal a
// majority granted. A primary takes writes only while it does.
func (c *Client) Held() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Before(c.heldUntil)
}

func (c *Client) extend(start time.Time, term uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.term != term {
		return // a take-over moved on meanwhile
	}
	if u := start.Add(c.cfg.RenewDeadline); u.After(c.heldUntil) {
		c.heldUntil = u
		c.renewals.Advance(c.renewals.Load() + 1)
	}
}

// Renewed returns a channel closed by this node's next acquisition or
// renewal of the election (after which Held may be true again).
func (c *Client) Renewed() <-chan struct{} {
	_, ch := c.renewals.Changed()
	return ch
}

// jitter spreads retries of nodes that started together.
func (c *Client) jitter() time.Duration {
	return c.cfg.RetryPeriod/2 + rand.N(c.cfg.RetryPeriod)
}

// Campaign contends until ctx ends or, having held the election, this
// node loses it; lead runs while it holds it, with a context that ends
// when it stops holding it, and Campaign returns only after lead did.
// Ending ctx releases a held election. Only with create may it take a
// register never held (a new cluster's first primary).
func (c *Client) Campaign(ctx context.Context, create bool, lead func(context.Context)) error {
	for ctx.Err() == nil {
		term, ok := c.acquire(ctx, create)
		if ok {
			c.hold(ctx, term, lead)
			return nil
		}
		backoff.Sleep(ctx, c.jitter())
	}
	return nil
}

// acquire reads the registers and, if no live holder other than this node
// holds a majority of them and failover is not paused, campaigns for the
// next term. A campaign that won only a minority releases what it won, so
// that another candidate need not wait out a lease.
func (c *Client) acquire(ctx context.Context, create bool) (uint64, bool) {
	v, err := c.Read(ctx)
	switch {
	case err != nil:
		return 0, false
	case v.Paused && v.Holder != c.cfg.ID:
		return 0, false
	case v.Alive && v.Holder != c.cfg.ID:
		return 0, false
	}
	c.mu.Lock()
	term := max(v.Term, c.term) + 1
	c.mu.Unlock()
	start := time.Now()
	maj := c.majority()
	as := c.send(ctx, &walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_CAMPAIGN, CandidateId: c.cfg.ID, Term: term, Create: create},
		c.cfg.RenewDeadline, func(as []answer) bool { return granted(as) >= maj })
	if granted(as) >= maj {
		c.mu.Lock()
		c.term = term
		c.mu.Unlock()
		c.extend(start, term)
		c.logger.Info("won the election", "term", term)
		c.note("won the election at term %d", term)
		return term, true
	}
	c.logger.Info("campaign lost", "term", term, "granted", granted(as), "needed", maj, "why", why(as))
	c.note("lost a campaign for term %d: %d of %d granted (%s)", term, granted(as), maj, why(as))
	if granted(as) > 0 {
		c.release(ctx, term)
	}
	return 0, false
}

// hold renews the election every RetryPeriod while lead runs, until ctx
// ends or a renewal fails for RenewDeadline; then it ends lead's context
// and waits for lead.
func (c *Client) hold(ctx context.Context, term uint64, lead func(context.Context)) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); lead(lctx) }()
	maj := c.majority()
	t := time.NewTicker(c.cfg.RetryPeriod)
	defer t.Stop()
	for lctx.Err() == nil {
		select {
		case <-lctx.Done():
		case <-t.C:
		}
		if lctx.Err() != nil {
			break
		}
		start := time.Now()
		as := c.send(lctx, &walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_RENEW, CandidateId: c.cfg.ID, Term: term},
			c.cfg.RetryPeriod, func(as []answer) bool { return granted(as) >= maj })
		if granted(as) >= maj {
			c.extend(start, term)
			continue
		}
		if !c.Held() {
			c.logger.Warn("lost the election: no majority of log stores renewed it", "term", term, "why", why(as))
			c.note("lost the election held at term %d: %s", term, why(as))
			cancel()
		}
	}
	<-done
	if ctx.Err() != nil {
		// Told to stop (a deposed primary, a failed promotion): free the
		// election at once rather than a lease later.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.RenewDeadline)
		c.release(rctx, term)
		rcancel()
		c.note("released the election held at term %d", term)
	}
}

// release gives term up at every log store that holds it for this node.
func (c *Client) release(ctx context.Context, term uint64) {
	c.mu.Lock()
	if c.term == term {
		c.heldUntil = time.Time{}
	}
	c.mu.Unlock()
	c.send(ctx, &walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_RELEASE, CandidateId: c.cfg.ID, Term: term}, c.cfg.RenewDeadline, nil)
}

// TakeOver makes this node the holder whoever holds it, paused or not:
// for a node that has just won an epoch vote (which fenced every other
// would-be primary), so that the election follows the epoch.
func (c *Client) TakeOver(ctx context.Context) error {
	maj := c.majority()
	for try := 0; try < 5; try++ {
		v, err := c.Read(ctx)
		if err != nil {
			return err
		}
		c.mu.Lock()
		term := max(v.Term, c.term) + 1
		c.term = term
		c.mu.Unlock()
		start := time.Now()
		as := c.send(ctx, &walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_TAKE_OVER, CandidateId: c.cfg.ID, Term: term},
			c.cfg.RenewDeadline, func(as []answer) bool { return granted(as) >= maj })
		if granted(as) >= maj {
			c.extend(start, term)
			c.note("took the election over at term %d", term)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return errors.New("could not take the election over: the log stores keep granting newer terms")
}

// Exists reports whether the election was ever held.
func (c *Client) Exists(ctx context.Context) (bool, error) {
	v, err := c.Read(ctx)
	if err != nil {
		return false, err
	}
	return v.Term > 0, nil
}

// Label does nothing: outside Kubernetes no label routes clients (they
// find the primary through any node's NotPrimary answer).
func (c *Client) Label(context.Context, string, *bool) error { return nil }

// Event logs what happened and keeps it as the last outcome.
func (c *Client) Event(_ context.Context, kind, reason, message string) {
	level := slog.LevelInfo
	if kind != "Normal" {
		level = slog.LevelWarn
	}
	c.logger.Log(context.Background(), level, "election event", "reason", reason, "message", message)
	c.note("%s: %s", reason, message)
}

// SetPaused pauses (or resumes) automatic failover: it numbers the change
// after the newest a majority knows, and writes it to every log store.
// Done once a majority holds it: every campaign's majority then includes
// one of them, and they pass it on with every answer.
func (c *Client) SetPaused(ctx context.Context, paused bool) (View, error) {
	v, err := c.Read(ctx)
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	c.pauseVersion, c.paused = c.pauseVersion+1, paused
	version := c.pauseVersion
	c.mu.Unlock()
	as := c.send(ctx, &walshipv1.ElectRequest{Op: walshipv1.ElectOp_ELECT_OP_READ}, 3*c.cfg.RenewDeadline, nil)
	n := 0
	for _, a := range as {
		if a.err == nil && a.resp.GetPauseVersion() >= version {
			n++
		}
	}
	v = c.LastView()
	if n < c.majority() {
		return v, fmt.Errorf("%d of %d log stores hold it, %d needed: %s", n, len(as), c.majority(), why(as))
	}
	return v, nil
}
