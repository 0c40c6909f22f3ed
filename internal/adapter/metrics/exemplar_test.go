package metrics

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
)

// TestExemplars: a traced request's trace id is an exemplar of its
// duration and time-to-first-byte observations, exposed in the
// OpenMetrics format; an untraced one adds none and allocates nothing.
func TestExemplars(t *testing.T) {
	m, reg := newTest(t)
	const tid = "4bf92f3577b34da6a3ce929d0e0e4736"
	m.RequestDoneTraced("smol", OutcomeOK, 120*time.Millisecond, tid)
	m.FirstByteTraced("smol", 15*time.Millisecond, tid)
	for _, name := range []string{"tlgate_request_duration_seconds", "tlgate_time_to_first_byte_seconds"} {
		mt := series(t, reg, name, map[string]string{"route": "smol"})
		if mt == nil {
			t.Fatalf("%s: no series", name)
		}
		found := false
		for _, b := range mt.GetHistogram().GetBucket() {
			if ex := b.GetExemplar(); ex != nil {
				for _, lp := range ex.GetLabel() {
					found = found || lp.GetName() == ExemplarTraceID && lp.GetValue() == tid
				}
			}
		}
		if !found {
			t.Errorf("%s has no exemplar with trace_id %s", name, tid)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeOpenMetrics))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(buf.String(), `# {trace_id="`+tid+`"}`) {
		t.Errorf("OpenMetrics exposition lacks the exemplar:\n%s", buf.String())
	}
	if n := testing.AllocsPerRun(100, func() {
		m.RequestDoneTraced("smol", OutcomeOK, time.Second, "")
		m.FirstByteTraced("smol", time.Millisecond, "")
	}); n != 0 {
		t.Errorf("untraced observations allocate %v times", n)
	}
}
