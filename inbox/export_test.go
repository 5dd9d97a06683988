package inbox

import (
	"context"

	"github.com/txhook/txhook"
)

// FailStuck runs the inbox's check for stuck events once, as its periodic
// job does.
func (ib *Inbox) FailStuck(ctx context.Context) ([]txhook.EventRecord, error) {
	return ib.failStuck(ctx)
}
