package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/txhook/txhook"
)

// writeQueue prints inbox mode's queue: how many events wait for their job,
// and how long the oldest has waited.
func writeQueue(w io.Writer, s txhook.Stats) {
	if s.Queue.Queued == 0 {
		fmt.Fprintln(w, "inbox queue: empty")
		return
	}
	fmt.Fprintf(w, "inbox queue: %d events queued, the oldest accepted %s ago\n",
		s.Queue.Queued, s.Queue.OldestAge.Round(time.Second))
}
