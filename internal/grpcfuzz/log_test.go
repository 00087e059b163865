package grpcfuzz

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// logBuffer keeps the newest lines the cluster logged at WARN and above:
// what the servers said about an input explains a finding better than the
// status code alone.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
	max   int
}

func newLogBuffer(n int) *logBuffer { return &logBuffer{max: n} }

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		b.lines = append(b.lines, string(l))
	}
	if over := len(b.lines) - b.max; over > 0 {
		b.lines = append(b.lines[:0:0], b.lines[over:]...)
	}
	return len(p), nil
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// tail returns the newest n lines.
func (b *logBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines[max(0, len(b.lines)-n):], "\n")
}
