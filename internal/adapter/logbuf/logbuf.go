// Package logbuf writes log lines in batches: a line goes into a buffer,
// and the buffer to the output when it is full, every flush interval, at
// once after a warning or an error, and when the writer is closed. At a
// thousand requests a second the access log's lines would otherwise cost a
// write system call each. A line is never split across writes, nor lost
// while the process lives; on a crash the last interval's info lines may
// be.
package logbuf

import (
	"bufio"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultSize is the buffer a Writer holds: lines are written out before
// it would overflow.
const DefaultSize = 64 << 10

// Writer is a zerolog.LevelWriter that batches the lines written to it
// (see the package doc). It is safe for concurrent use.
type Writer struct {
	mu   sync.Mutex
	buf  *bufio.Writer
	stop chan struct{}
	done chan struct{}
}

// New returns a Writer to out that flushes every interval (> 0) and when
// DefaultSize bytes are pending. Close it to write what is pending and to
// stop its flusher.
func New(out io.Writer, interval time.Duration) *Writer {
	w := &Writer{buf: bufio.NewWriterSize(out, DefaultSize), stop: make(chan struct{}), done: make(chan struct{})}
	go w.flushEvery(interval)
	return w
}

// flushEvery writes out what is pending every interval until Close.
func (w *Writer) flushEvery(interval time.Duration) {
	defer close(w.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			_ = w.Flush()
		}
	}
}

// Write adds one line (zerolog writes a whole line per call), writing
// out what is pending first when the line would not fit.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(p) > w.buf.Available() && w.buf.Buffered() > 0 {
		if err := w.buf.Flush(); err != nil {
			return 0, err
		}
	}
	return w.buf.Write(p)
}

// WriteLevel writes a line of level l: a warning or worse is written out
// at once, with what was pending before it.
func (w *Writer) WriteLevel(l zerolog.Level, p []byte) (int, error) {
	n, err := w.Write(p)
	if err != nil || l < zerolog.WarnLevel || l == zerolog.NoLevel {
		return n, err
	}
	return n, w.Flush()
}

// Flush writes out what is pending.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Flush()
}

// Close stops the flusher and writes out what is pending.
func (w *Writer) Close() error {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	return w.Flush()
}
