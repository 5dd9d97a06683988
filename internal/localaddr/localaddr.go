// Package localaddr finds free TCP addresses on the loopback interface, for
// the servers and child processes that txhook's tools and tests start.
package localaddr

import (
	"fmt"
	"net"
)

// Free returns a loopback address, "127.0.0.1:port", whose port was free
// when asked. Another process may take the port before the caller binds it.
func Free() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

// FreePort returns a loopback port that was free when asked.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
