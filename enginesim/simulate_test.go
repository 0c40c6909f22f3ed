package enginesim

import "testing"

// TestSimulateIsDeterministicAndBatches checks the calibration simulator:
// the same load gives the same figures, and batching raises throughput
// and inter-token latency together, as on a real engine.
func TestSimulateIsDeterministicAndBatches(t *testing.T) {
	load := func(c int) SimLoad {
		reqs := make([]SimRequest, 4*c)
		for i := range reqs {
			reqs[i] = SimRequest{Input: 200 + 17*i%100, Output: 50 + 13*i%40}
		}
		return SimLoad{Concurrency: c, Requests: reqs}
	}
	a, err := Simulate(PresetLlama8BH100, load(8))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := Simulate(PresetLlama8BH100, load(8)); a != b {
		t.Fatalf("two runs differ: %+v %+v", a, b)
	}
	one, _ := Simulate(PresetLlama8BH100, load(1))
	if !(a.OutputThroughput > 2*one.OutputThroughput && a.TPOT > one.TPOT && one.TPOT > PresetLlama8BH100.Step.Cost.Fixed) {
		t.Fatalf("concurrency 1: %+v; 8: %+v", one, a)
	}
	if _, err := Simulate(PresetLlama8BH100, SimLoad{}); err == nil {
		t.Fatal("an empty load was simulated")
	}
}
