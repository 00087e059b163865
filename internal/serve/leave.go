package serve

import (
	"context"
	"log/slog"
	"time"
)

// DefaultLeaveTimeout bounds a scaled-down server's removal from the
// membership when its LeaveTimeout is 0: a removal has no learner stage,
// two records' acknowledgements once the primary takes it, and other pods
// scaled down at the same moment may be removed first (one change at a
// time).
const DefaultLeaveTimeout = 15 * time.Second

// Leave is the start of a data node's or a log store's stop under
// --leave-on-scale-down: it asks leaving (internal/kube Client.ScaledDown)
// whether the server is going away for good, under timeout
// (DefaultLeaveTimeout when 0), and logs the decision. For a scale-down
// it returns the context the removal runs in, the same timeout from now;
// otherwise — no question to ask, not a scale-down, no answer — a nil
// context: the server stays what it is (stay, "a member"), and the
// operator removes it if it was meant to go. what names the server in
// the log ("node", "log store"); attrs go with the scale-down's line.
func Leave(leaving func(context.Context) (down bool, why string, err error), timeout time.Duration, logger *slog.Logger, what, stay string, attrs ...any) (context.Context, context.CancelFunc) {
	if leaving == nil {
		return nil, func() {}
	}
	if timeout <= 0 {
		timeout = DefaultLeaveTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	down, why, err := leaving(ctx)
	switch {
	case err != nil:
		logger.Warn("stopping: cannot tell whether this is a scale-down; staying "+stay, "err", err)
	case !down:
		logger.Info("stopping: not a scale-down; staying "+stay, "why", why)
	default:
		logger.Info("stopping for a scale-down: asking the primary to remove this "+what, append([]any{"why", why, "timeout", timeout}, attrs...)...)
		return ctx, cancel
	}
	cancel()
	return nil, func() {}
}
