// Package benchstat holds what the benchmarks that run a baseline beside fenced's variant share:
// per-round ratios summarized by their median, which a burst of load on a shared machine moves
// less than a ratio of means.
package benchstat

import "slices"

// Median returns the median of v (0 for none); v is sorted in place.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
