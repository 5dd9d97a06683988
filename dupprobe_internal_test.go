package txhook

import "testing"

func TestDupShare(t *testing.T) {
	var s dupShare
	if s.mostly() {
		t.Fatal("a new estimate says mostly duplicates")
	}
	// 1 - (15/16)^n passes one half at n = 11.
	for i := 1; i <= 11; i++ {
		s.observe(true)
		if got, want := s.mostly(), i == 11; got != want {
			t.Fatalf("after %d duplicates: mostly = %v, want %v", i, got, want)
		}
	}
	for range 1000 {
		s.observe(true)
	}
	if v := s.v.Load(); v >= dupShareOne {
		t.Fatalf("estimate %d reached or passed one", v)
	}
	// From near one, 11 new events bring it back under one half.
	for i := 1; i <= 11; i++ {
		s.observe(false)
		if got, want := s.mostly(), i < 11; got != want {
			t.Fatalf("after %d new events: mostly = %v, want %v", i, got, want)
		}
	}
}
