package cli

// SetServeHooks installs the service's test hooks until the returned function is called.
func SetServeHooks(connActive, shutdown func()) (restore func()) {
	old := serveHooks
	serveHooks.connActive, serveHooks.shutdown = connActive, shutdown
	return func() { serveHooks = old }
}
