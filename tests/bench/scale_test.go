package main

import (
	"strings"
	"testing"
)

func TestScaleSectionIsReplacedAndKept(t *testing.T) {
	first := withScaleSection("# Benchmarks\n\nrows\n", "## Scale\n\nrun 1\n")
	if !strings.HasPrefix(first, "# Benchmarks\n\nrows\n\n"+scaleBegin) || !strings.Contains(first, "run 1") {
		t.Fatalf("appended section:\n%s", first)
	}
	second := withScaleSection(first, "## Scale\n\nrun 2\n")
	if strings.Contains(second, "run 1") || strings.Count(second, scaleBegin) != 1 || !strings.Contains(second, "run 2") {
		t.Fatalf("replaced section:\n%s", second)
	}
	// make bench writes a new report and keeps the scale section.
	kept := scaleSectionOf(second)
	if !strings.Contains(kept, "run 2") || !strings.HasPrefix(kept, scaleBegin) {
		t.Fatalf("section read back: %q", kept)
	}
	rewritten := withScaleSection("# Benchmarks\n\nnew rows\n", kept[len(scaleBegin):len(kept)-len(scaleEnd)-1])
	if strings.Count(rewritten, scaleBegin) != 1 || strings.Count(rewritten, scaleEnd) != 1 || !strings.Contains(rewritten, "run 2") || !strings.Contains(rewritten, "new rows") {
		t.Fatalf("rewritten report:\n%s", rewritten)
	}
	if scaleSectionOf("# Benchmarks\n") != "" {
		t.Fatal("a report without the section has one")
	}
}
