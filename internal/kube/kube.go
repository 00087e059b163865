// Package kube is a data node's view of Kubernetes: the Lease that says
// which node may try to become primary (client-go's leaderelection), the
// labels Services route on, and Events; and a log store's, which asks only
// whether its StatefulSet was scaled down (NewScaleDown).
//
// The Lease is a promotion gate, not a fence (client-go's leaderelection
// says it guarantees no fencing; its expiry is judged on each node's
// clock). The epoch vote decides who is primary; the Lease decides who may
// try, and a primary that cannot renew it stops taking writes before
// anyone else may take it: [Client.Held] turns false RenewDeadline after
// the start of its last successful renewal, while another node takes it
// only LeaseDuration after it saw the record change — which it sees at one
// second's precision (the record's times are whole seconds), so up to 1 s
// after the renewal. Hence RenewDeadline ≤ 0.9 × (LeaseDuration − 1 s).
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"

	"github.com/walship/walship/internal/watermark"
)

// The Pod labels a data node sets on its own Pod. The walship-rw Service
// selects RoleLabel=primary, walship-ro ReadsLabel=true: two labels, so
// that a hand-over's relabelling (replica → primary) changes only
// walship-rw's EndpointSlice, and the new primary leaves walship-ro a
// grace later, in an update of its own (services/node, label.go).
const (
	RoleLabel  = "walship.io/role"
	ReadsLabel = "walship.io/reads"
)

// The defaults: a primary that has not renewed for 900 ms (five tries)
// stops taking writes (availability, never safety: the epoch vote
// fences); a dead primary's Lease is free 1-2 s after its last renewal.
const (
	DefaultLeaseDuration = 2 * time.Second
	DefaultRenewDeadline = 900 * time.Millisecond
	DefaultRetryPeriod   = 200 * time.Millisecond
)

// Config says where the Lease and the Pod are.
type Config struct {
	// Kubeconfig is a kubeconfig file; "" uses the in-cluster config (the
	// pod's service account).
	Kubeconfig string
	// Namespace and Pod name this node's Pod (POD_NAMESPACE, POD_NAME).
	Namespace, Pod string
	// Lease names the cluster's coordination.k8s.io Lease.
	Lease string
	// LeaseDuration, RenewDeadline and RetryPeriod are leaderelection's.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Logger receives the client's logs; nil discards them.
	Logger *slog.Logger
	// LeaveOnScaleDown is --leave-on-scale-down: the node asks ScaledDown
	// when told to stop (services/node Config.Leaving).
	LeaveOnScaleDown bool
}

// Validate checks c, naming the flag of what is wrong.
func (c Config) Validate() error {
	var errs []error
	if c.Lease == "" {
		errs = append(errs, errors.New("--kube-lease: required"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("--pod-namespace: required (POD_NAMESPACE from the downward API)"))
	}
	if c.Pod == "" {
		errs = append(errs, errors.New("--pod-name: required (POD_NAME from the downward API)"))
	}
	if c.RetryPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--kube-retry-period: %v is not positive", c.RetryPeriod))
	}
	if c.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(c.RetryPeriod)) {
		errs = append(errs, fmt.Errorf("--kube-renew-deadline: %v must exceed %v × --kube-retry-period", c.RenewDeadline, leaderelection.JitterFactor))
	}
	if c.LeaseDuration < 2*time.Second || c.LeaseDuration%time.Second != 0 {
		// The Lease stores whole seconds, and others see it renewed at
		// one second's precision.
		errs = append(errs, fmt.Errorf("--kube-lease-duration: %v is not a whole number of seconds, at least 2s", c.LeaseDuration))
	} else if max := (c.LeaseDuration - time.Second) * 9 / 10; c.RenewDeadline > max {
		errs = append(errs, fmt.Errorf("--kube-renew-deadline: %v exceeds 0.9 × (--kube-lease-duration − 1s) = %v: a primary could take writes after others may take its Lease", c.RenewDeadline, max))
	}
	return errors.Join(errs...)
}

// Client is a node's connection to the API server.
type Client struct {
	cfg    Config
	cs     kubernetes.Interface
	logger *slog.Logger

	host string // for Events

	mu        sync.Mutex
	heldUntil time.Time // with the monotonic clock
	// renewals counts the writes that moved heldUntil on, for Renewed.
	renewals watermark.Watermark
	role     *string // the role label last set (nil: unknown)
	reads    *bool   // the reads label last set (nil: unknown)
}

// New connects (lazily: no call is made yet).
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Each call is bounded well inside the renew deadline.
	return connect(cfg, cfg.RenewDeadline)
}

// scaleDownCallTimeout bounds a ScaledDown call of a client without a
// Lease: it runs inside a stop's --leave-timeout.
const scaleDownCallTimeout = 5 * time.Second

// NewScaleDown connects for ScaledDown alone, with no Lease: a log store's
// --leave-on-scale-down, which needs only its Pod's name (a StatefulSet's
// pod) and namespace.
func NewScaleDown(cfg Config) (*Client, error) {
	var errs []error
	if cfg.Namespace == "" {
		errs = append(errs, errors.New("--pod-namespace: required with --leave-on-scale-down (POD_NAMESPACE from the downward API)"))
	}
	if cfg.Pod == "" {
		errs = append(errs, errors.New("--pod-name: required with --leave-on-scale-down (POD_NAME from the downward API)"))
	} else if _, _, err := StatefulSetOrdinal(cfg.Pod); err != nil {
		errs = append(errs, fmt.Errorf("--pod-name: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return connect(cfg, scaleDownCallTimeout)
}

// connect makes the client, each API call bounded by timeout.
func connect(cfg Config, timeout time.Duration) (*Client, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	rc.Timeout = timeout
	rc.UserAgent = "walship"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	host, _ := os.Hostname()
	return &Client{cfg: cfg, cs: cs, logger: cfg.Logger, host: host}, nil
}

// Held reports whether this node holds the Lease now: within
// RenewDeadline of the start of its last successful acquisition or
// renewal. A primary takes writes only while it does.
func (c *Client) Held() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Before(c.heldUntil)
}

// Renewed returns a channel closed by this node's next acquisition or
// renewal of the Lease (after which Held may be true again).
func (c *Client) Renewed() <-chan struct{} {
	_, ch := c.renewals.Changed()
	return ch
}

func (c *Client) extend(start time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u := start.Add(c.cfg.RenewDeadline); u.After(c.heldUntil) {
		c.heldUntil = u
		c.renewals.Advance(c.renewals.Load() + 1)
	}
}

func (c *Client) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.heldUntil = time.Time{}
}

func (c *Client) newLock() *gatedLock {
	return &gatedLock{create: true, Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: c.cfg.Lease, Namespace: c.cfg.Namespace},
		Client:     c.cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Pod},
	}, c: c}
}

// gatedLock is the Lease lock that moves Held: a write that makes this
// node the holder extends it from the write's start; one that gives it
// up (a release) drops it first, and is skipped unless the Lease read
// just before names this node (client-go's release judges by the record
// it last saw, and would otherwise free a Lease another node took over).
type gatedLock struct {
	resourcelock.Interface
	c *Client

	create bool // whether it may create the Lease

	mu      sync.Mutex
	lastGot string // the holder of the record last read
}

func (l *gatedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	if err == nil {
		l.mu.Lock()
		l.lastGot = r.HolderIdentity
		l.mu.Unlock()
	}
	return r, raw, err
}

func (l *gatedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if !l.create {
		return errNoCreate
	}
	return l.write(ctx, r, l.Interface.Create)
}

var errNoCreate = errors.New("the Lease does not exist, and only a primary creates it")

func (l *gatedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, r, l.Interface.Update)
}

func (l *gatedLock) write(ctx context.Context, r resourcelock.LeaderElectionRecord, w func(context.Context, resourcelock.LeaderElectionRecord) error) error {
	if r.HolderIdentity != l.Identity() {
		l.c.drop()
		l.mu.Lock()
		mine := l.lastGot == l.Identity()
		l.mu.Unlock()
		if !mine {
			return nil // another node holds it now: nothing to release
		}
		return w(ctx, r)
	}
	start := time.Now()
	err := w(ctx, r)
	if err == nil {
		l.c.extend(start)
	}
	return err
}

// Campaign contends for the Lease until ctx ends or, having held it, this
// node loses it; lead runs while it holds it, with a context that ends
// when it stops holding it, and Campaign returns only after lead did.
// Ending ctx releases a held Lease. Only with create may it create the
// Lease when none exists: a new cluster's Lease is its first primary's.
func (c *Client) Campaign(ctx context.Context, create bool, lead func(context.Context)) error {
	lock := c.newLock()
	lock.create = create
	var (
		mu       sync.Mutex
		ended    bool
		leadDone chan struct{} // closed when lead returned
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   c.cfg.LeaseDuration,
		RenewDeadline:   c.cfg.RenewDeadline,
		RetryPeriod:     c.cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            c.cfg.Lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				mu.Lock()
				if ended {
					mu.Unlock()
					return
				}
				ch := make(chan struct{})
				leadDone = ch
				mu.Unlock()
				defer close(ch)
				lead(lctx)
			},
			// Not c.drop: client-go calls this also when this campaign never
			// led, and the node may hold the Lease by TakeOver meanwhile. A
			// campaign that led and lost it failed to renew, and Held lapses
			// by itself; a release drops it in gatedLock.
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	// Run ended lead's context; wait until lead is done with it.
	mu.Lock()
	ended = true
	ch := leadDone
	mu.Unlock()
	if ch != nil {
		<-ch
	}
	return nil
}

// TakeOver makes this node the Lease's holder whoever holds it: for a
// node that has just won an epoch vote (which fenced every other would-be
// primary), so that the Lease follows the epoch.
func (c *Client) TakeOver(ctx context.Context) error {
	// The holder renews meanwhile: read and write again on a conflict.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l := c.newLock()
		now := metav1.NowMicro()
		rec := resourcelock.LeaderElectionRecord{HolderIdentity: c.cfg.Pod, LeaseDurationSeconds: int(c.cfg.LeaseDuration / time.Second),
			AcquireTime: metav1.Time(now), RenewTime: metav1.Time(now)}
		old, _, err := l.Get(ctx)
		switch {
		case apierrors.IsNotFound(err):
			return l.Create(ctx, rec)
		case err != nil:
			return err
		case old.HolderIdentity == c.cfg.Pod:
			rec.AcquireTime, rec.LeaderTransitions = old.AcquireTime, old.LeaderTransitions
		default:
			rec.LeaderTransitions = old.LeaderTransitions + 1
		}
		return l.Update(ctx, rec)
	})
}

// Exists reports whether the Lease exists (a cluster was bootstrapped).
func (c *Client) Exists(ctx context.Context) (bool, error) {
	_, _, err := c.newLock().Get(ctx)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Label sets this node's Pod's role label (role "" removes it) and its
// reads label (true sets it, false removes it, nil leaves it as it is),
// in one patch; it skips what is already so, and the call when both are.
func (c *Client) Label(ctx context.Context, role string, reads *bool) error {
	c.mu.Lock()
	labels := map[string]any{}
	if c.role == nil || *c.role != role {
		labels[RoleLabel] = labelValue(role)
	}
	if reads != nil && (c.reads == nil || *c.reads != *reads) {
		v := ""
		if *reads {
			v = "true"
		}
		labels[ReadsLabel] = labelValue(v)
	}
	c.mu.Unlock()
	if len(labels) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	if _, err := c.cs.CoreV1().Pods(c.cfg.Namespace).Patch(ctx, c.cfg.Pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label pod %s/%s %s: %w", c.cfg.Namespace, c.cfg.Pod, patch, err)
	}
	c.mu.Lock()
	c.role = &role
	if reads != nil {
		r := *reads
		c.reads = &r
	}
	c.mu.Unlock()
	return nil
}

// labelValue is a merge patch's value for a label: nil (null) removes it.
func labelValue(v string) any {
	if v == "" {
		return nil
	}
	return v
}

// Event records an Event on this node's Pod (best effort: an error is
// logged, not returned). kind is corev1.EventTypeNormal or Warning.
func (c *Client) Event(ctx context.Context, kind, reason, message string) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: c.cfg.Pod + ".", Namespace: c.cfg.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: c.cfg.Namespace, Name: c.cfg.Pod},
		Reason:         reason, Message: message, Type: kind,
		Source:         corev1.EventSource{Component: "walship", Host: c.host},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "walship.io/node", ReportingInstance: c.cfg.Pod,
	}
	if _, err := c.cs.CoreV1().Events(c.cfg.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		c.logger.Warn("could not record an event", "reason", reason, "err", err)
	}
}

// StatefulSetOrdinal splits a StatefulSet pod's name into its set's name
// and its ordinal ("walship-3": "walship", 3), or says why it is not one.
func StatefulSetOrdinal(pod string) (set string, ordinal int, err error) {
	i := strings.LastIndexByte(pod, '-')
	if i <= 0 {
		return "", 0, fmt.Errorf("pod %q is not named <statefulset>-<ordinal>", pod)
	}
	n, err := strconv.Atoi(pod[i+1:])
	if err != nil || n < 0 || strconv.Itoa(n) != pod[i+1:] {
		return "", 0, fmt.Errorf("pod %q is not named <statefulset>-<ordinal>", pod)
	}
	return pod[:i], n, nil
}

// ScaledDown reports whether this node's Pod is going away for good: its
// StatefulSet exists, is not being deleted, and wants fewer replicas than
// its ordinal (StatefulSets remove the highest ordinals first). A rolling
// update, an eviction, a deleted Pod or the whole StatefulSet deleted is
// no scale-down: the pod comes back (or the cluster goes as a whole), and
// it stays a member. why says what was seen, for the log.
func (c *Client) ScaledDown(ctx context.Context) (down bool, why string, err error) {
	set, ord, err := StatefulSetOrdinal(c.cfg.Pod)
	if err != nil {
		return false, "", err
	}
	ss, err := c.cs.AppsV1().StatefulSets(c.cfg.Namespace).Get(ctx, set, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, fmt.Sprintf("statefulset %s/%s is gone", c.cfg.Namespace, set), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get statefulset %s/%s: %w", c.cfg.Namespace, set, err)
	}
	replicas := int32(1) // the API's default
	if ss.Spec.Replicas != nil {
		replicas = *ss.Spec.Replicas
	}
	down, why = ScaledDownTo(ord, replicas, ss.DeletionTimestamp != nil)
	return down, fmt.Sprintf("statefulset %s/%s: %s", c.cfg.Namespace, set, why), nil
}

// ScaledDownTo is ScaledDown's decision for the pod of ordinal ord when
// its StatefulSet wants replicas pods (deleting: the StatefulSet itself
// is being deleted).
func ScaledDownTo(ord int, replicas int32, deleting bool) (down bool, why string) {
	switch {
	case deleting:
		return false, "being deleted, with all its pods"
	case int64(ord) >= int64(replicas):
		return true, fmt.Sprintf("spec.replicas %d leaves out ordinal %d", replicas, ord)
	}
	return false, fmt.Sprintf("spec.replicas %d keeps ordinal %d", replicas, ord)
}
