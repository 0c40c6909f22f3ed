package logbuf

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
	"github.com/tlgate/tlgate/internal/testkit/syncbuf"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestWriterBatches: info lines wait for the interval, a warning takes
// what is pending out with it at once, a line that would overflow the
// buffer takes the pending ones out first, and Close writes the rest.
func TestWriterBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out syncbuf.Buffer
		w := New(&out, 100*time.Millisecond)
		log := zerolog.New(w)
		log.Info().Msg("one")
		log.Info().Msg("two")
		if out.String() != "" {
			t.Fatalf("info lines written before the interval: %q", out.String())
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if got := strings.Count(out.String(), "\n"); got != 2 {
			t.Fatalf("%d lines after the interval, want 2: %q", got, out.String())
		}
		log.Info().Msg("three")
		log.Warn().Msg("four")
		if !strings.HasSuffix(out.String(), `"message":"three"}`+"\n"+`{"level":"warn","message":"four"}`+"\n") {
			t.Fatalf("a warning did not take the pending line out with it at once: %q", out.String())
		}
		log.Info().Msg("five")
		half := strings.Repeat("x", DefaultSize/2)
		log.Info().Msg(half)
		if strings.Contains(out.String(), "five") {
			t.Fatal("info lines written before the interval, the buffer not full")
		}
		log.Info().Msg(half + "y")
		if !strings.HasSuffix(out.String(), `"message":"five"}`+"\n"+`{"level":"info","message":"`+half+`"}`+"\n") {
			t.Fatalf("a line that would overflow did not take the pending ones out first")
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(out.String(), half+`y"}`+"\n") {
			t.Fatal("Close did not write the pending line")
		}
		if err := w.Close(); err != nil {
			t.Fatal("a second Close failed:", err)
		}
	})
}
