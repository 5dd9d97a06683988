package amqpconsumer

import "time"

// RetryQueueNames returns the names of every retry queue a consumer of
// queue may declare, for tests to remove them.
func RetryQueueNames(queue string) []string {
	var names []string
	for _, unit := range []time.Duration{time.Millisecond, time.Second} {
		for w := unit; w < 1024*unit; w *= 2 {
			names = append(names, queue+".retry."+waitName(w))
		}
	}
	return names
}
