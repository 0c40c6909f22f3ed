package enginesim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestSlotTime checks the busy and stalled slot-seconds over a script of
// admissions: a queue behind full slots is not stalled, one whose head does
// not fit the free KV blocks while a slot is free is.
func TestSlotTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCore(4, 2, time.Minute)
		ctx := context.Background()
		admitted := func(want int) chan *seq {
			ch := make(chan *seq, 1)
			go func() {
				s, err := c.admit(ctx, &admission{want: blockSet{private: want}})
				if err != nil {
					t.Errorf("admit %d blocks: %v", want, err)
				}
				ch <- s
			}()
			synctest.Wait()
			return ch
		}
		check := func(step string, busy, stalled time.Duration) {
			t.Helper()
			c.mu.Lock()
			c.settleLocked()
			got := c.slots
			c.mu.Unlock()
			if got.busy != busy || got.stalled != stalled {
				t.Fatalf("%s: busy %v stalled %v, want %v %v", step, got.busy, got.stalled, busy, stalled)
			}
		}

		a, b := admitted(1), admitted(1)
		sa, sb := <-a, <-b
		waitFull := admitted(1) // both slots are taken: it queues
		time.Sleep(3 * time.Second)
		check("queue behind full slots", 6*time.Second, 0)

		c.finish(sa) // waitFull runs; 1 block of 4 free after it
		sc := <-waitFull
		time.Sleep(2 * time.Second)
		check("two running", 10*time.Second, 0)

		c.finish(sb)
		big := admitted(4) // a slot is free, but 3 blocks are
		if len(big) != 0 {
			t.Fatal("a 4-block sequence was admitted beside a running one on 4 blocks")
		}
		time.Sleep(5 * time.Second)
		check("stalled on KV", 15*time.Second, 5*time.Second)

		c.finish(sc) // big runs alone
		sd := <-big
		time.Sleep(time.Second)
		c.finish(sd)
		time.Sleep(time.Second) // idle, nothing waiting: neither
		check("done", 16*time.Second, 5*time.Second)
	})
}
