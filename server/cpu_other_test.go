//go:build !unix

package server_test

import (
	"testing"
	"time"
)

// processCPU reads getrusage, which only Unix systems have: elsewhere the benchmarks' CPU
// metrics are 0.
func processCPU(*testing.B) time.Duration { return 0 }
