package server

// SetHook makes f see the parked waiters' moments ("parked", "gone", "released", "answered",
// "loop" and "loop-end" for a connection served by the loop).
// Set it before the first request.
func SetHook(s *Server, f func(event string)) { s.hook = f }

// SetTakenOverHook makes f run just after each connection is taken over from net/http.
// Set it before the first request.
func SetTakenOverHook(s *Server, f func()) { s.takenOver = f }
