// Package promsum reads a metric back from a Prometheus registry in a
// test: the sum of a family's counter and gauge samples whose labels
// include the ones asked for.
package promsum

import "github.com/prometheus/client_golang/prometheus"

// Sum sums the counter and gauge samples of family name in g whose labels
// include every pair of labels ("k", "v", ...); found is false when no
// sample matched (or g could not be gathered).
func Sum(g prometheus.Gatherer, name string, labels ...string) (total float64, found bool) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for j := 0; j+1 < len(labels); j += 2 {
				if have[labels[j]] != labels[j+1] {
					continue next
				}
			}
			found = true
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total, found
}
