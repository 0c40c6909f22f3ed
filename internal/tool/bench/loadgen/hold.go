package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// Streams are streamed requests held open by Hold.
type Streams struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Close cuts every held stream and waits until their readers have ended.
func (s *Streams) Close() {
	s.cancel()
	s.wg.Wait()
}

// Hold opens n copies of the streamed request r against the URLs p picks,
// at most parallel opening at once, and returns once each has delivered its
// first event: then every stream is open end to end and stays open (its
// reader blocks) until Close. It fails, closing what it opened, when a
// stream fails to open or ctx ends first.
func Hold(ctx context.Context, c *http.Client, p Picker, r Request, n, parallel int) (*Streams, error) {
	if !r.Stream {
		return nil, fmt.Errorf("loadgen: hold: %w", errors.New("the request is not streamed"))
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &Streams{cancel: cancel}
	sem := make(chan struct{}, max(1, parallel))
	opened := make(chan error, n)
	for range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			s.Close()
			return nil, fmt.Errorf("loadgen: hold: %w", ctx.Err())
		}
		url := p.Next()
		s.wg.Go(func() {
			release := sync.OnceFunc(func() { <-sem })
			defer release()
			wasOpen := false
			err := holdOne(sctx, c, url, r, func() { wasOpen = true; release(); opened <- nil })
			if err != nil && !wasOpen {
				opened <- err
			}
		})
	}
	for range n {
		select {
		case err := <-opened:
			if err != nil {
				s.Close()
				return nil, fmt.Errorf("loadgen: hold: %w", err)
			}
		case <-ctx.Done():
			s.Close()
			return nil, fmt.Errorf("loadgen: hold: %w", ctx.Err())
		}
	}
	return s, nil
}

// holdOne sends r, calls open after the first complete event, and then
// reads until the stream ends or ctx is cancelled.
func holdOne(ctx context.Context, c *http.Client, base string, r Request, open func()) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+r.Path, bytes.NewReader(r.Body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %d", ErrStatus, resp.StatusCode)
	}
	// Small reads: the held streams' own buffers should stay small.
	var buf [512]byte
	var seen []byte
	for {
		k, err := resp.Body.Read(buf[:])
		seen = append(seen, buf[:k]...)
		if bytes.Contains(seen, []byte("\n\n")) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrTruncated, err)
		}
	}
	open()
	for {
		if _, err := resp.Body.Read(buf[:]); err != nil {
			if err == io.EOF || ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}
