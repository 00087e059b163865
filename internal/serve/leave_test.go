package serve

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLeave(t *testing.T) {
	answer := func(down bool, why string, err error) func(context.Context) (bool, string, error) {
		return func(ctx context.Context) (bool, string, error) {
			if _, ok := ctx.Deadline(); !ok {
				t.Error("the question is asked without a deadline")
			}
			return down, why, err
		}
	}
	for _, tc := range []struct {
		name    string
		leaving func(context.Context) (bool, string, error)
		timeout time.Duration
		leave   bool
		within  time.Duration // the removal's deadline, from now
		log     string
	}{
		{name: "no question", leaving: nil},
		{name: "no answer", leaving: answer(false, "", errors.New("forbidden")), log: "cannot tell whether this is a scale-down; staying a member"},
		{name: "a restart", leaving: answer(false, "replicas 3, ordinal 1", nil), log: "not a scale-down; staying a member"},
		{name: "scaled down", leaving: answer(true, "replicas 2, ordinal 2", nil), timeout: 3 * time.Second, leave: true, within: 3 * time.Second,
			log: "asking the primary to remove this node"},
		{name: "default timeout", leaving: answer(true, "replicas 2, ordinal 2", nil), leave: true, within: DefaultLeaveTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			start := time.Now()
			ctx, cancel := Leave(tc.leaving, tc.timeout, slog.New(slog.NewTextHandler(&buf, nil)), "node", "a member", "advertise", "n1:7401")
			defer cancel()
			if got := ctx != nil; got != tc.leave {
				t.Fatalf("leave = %v, want %v (log: %s)", got, tc.leave, buf.String())
			}
			if !strings.Contains(buf.String(), tc.log) {
				t.Errorf("log %q lacks %q", buf.String(), tc.log)
			}
			if !tc.leave {
				return
			}
			dl, ok := ctx.Deadline()
			if !ok || dl.Before(start.Add(tc.within)) || dl.After(time.Now().Add(tc.within)) {
				t.Errorf("deadline %v from the start, want %v", dl.Sub(start), tc.within)
			}
			if !strings.Contains(buf.String(), "advertise=n1:7401") {
				t.Errorf("the scale-down's line lacks its attributes: %s", buf.String())
			}
		})
	}
}
