package gatetest

import (
	"slices"
	"testing"
)

// TestOrder: over n! rounds every order is a permutation, and each transaction runs equally
// often in each place and right after each other one, the previous round's last included.
// A rotation (session 8's order) fails the second count: each transaction had one predecessor.
func TestOrder(t *testing.T) {
	for n := 1; n <= 5; n++ {
		rounds := 1
		for i := 2; i <= n; i++ {
			rounds *= i
		}
		place := make([][]int, n) // place[k][i]: rounds in which k ran i-th
		after := make([][]int, n) // after[k][j]: times k ran right after j
		for k := range n {
			place[k], after[k] = make([]int, n), make([]int, n)
		}
		prev := -1
		for r := range rounds {
			o := Order(r, n)
			if s := slices.Sorted(slices.Values(o)); !slices.Equal(s, Order(0, n)) {
				t.Fatalf("n=%d round %d: %v is not a permutation", n, r, o)
			}
			for i, k := range o {
				place[k][i]++
				if prev >= 0 {
					after[k][prev]++
				}
				prev = k
			}
		}
		if !slices.Equal(Order(rounds, n), Order(0, n)) {
			t.Errorf("n=%d: round %d does not start the cycle again", n, rounds)
		}
		for k := range n {
			for i := range n {
				if want := rounds / n; place[k][i] != want {
					t.Errorf("n=%d: %d ran %d times in place %d, want %d", n, k, place[k][i], i, want)
				}
			}
			if n < 3 {
				continue // with two, each can only follow the other or itself
			}
			for j := range n {
				if j != k && after[k][j] == 0 {
					t.Errorf("n=%d: %d never ran right after %d", n, k, j)
				}
			}
		}
	}
}
