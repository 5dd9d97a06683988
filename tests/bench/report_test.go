package main

import "testing"

func TestRatioIsTakenRoundByRound(t *testing.T) {
	// The machine slowed down in round 2: a's median over b's (200/150)
	// would mix rounds; round by round a is twice as fast in two rounds of
	// three.
	r := &report{cells: []cell{
		{Scenario: "a", Concurrency: 8, Rates: []float64{100, 200, 300}},
		{Scenario: "b", Concurrency: 8, Rates: []float64{50, 400, 150}},
	}}
	if got := r.ratio("a", "b", 8); got != 2 {
		t.Fatalf("ratio = %v, want 2 (the median of 2, 0.5, 2)", got)
	}
	if got := r.roundRatios("a", "b", 8); len(got) != 3 || got[1] != 0.5 {
		t.Fatalf("round ratios = %v, want [2 0.5 2]", got)
	}
	if got := r.ratio("a", "missing", 8); got != 0 {
		t.Fatalf("ratio to a missing row = %v, want 0", got)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}
