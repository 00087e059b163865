package testkit

import (
	"bytes"
	"sync"
)

// Output is a process's or a goroutine's output that a test reads while
// it is written: a bytes.Buffer behind a mutex.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String is everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Head is the first n bytes written (all if fewer).
func (o *Output) Head(n int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.b.Bytes()
	return string(b[:min(n, len(b))])
}

// Tail is the last n bytes written (all if fewer).
func (o *Output) Tail(n int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.b.Bytes()
	return string(b[max(0, len(b)-n):])
}
