package driver

import "sync"

// Subscribers holds the signal channels of a ReleaseNotifier's subscriptions, by key (a
// resource, or whatever the engine's message names it by). The zero value is ready to use; it
// is safe for concurrent use by multiple goroutines.
type Subscribers struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

// Add subscribes to key: the channel receives (coalesced) after each Signal of key and each
// SignalAll, until stop.
func (s *Subscribers) Add(key string) (signal <-chan struct{}, stop func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs == nil {
		s.subs = map[string]map[chan struct{}]struct{}{}
	}
	if s.subs[key] == nil {
		s.subs[key] = map[chan struct{}]struct{}{}
	}
	s.subs[key][ch] = struct{}{}
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.subs[key], ch)
		if len(s.subs[key]) == 0 {
			delete(s.subs, key)
		}
	}
}

// Signal wakes the subscribers of key.
func (s *Subscribers) Signal(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs[key] {
		wake(ch)
	}
}

// SignalAll wakes every subscriber: the listening connection was lost, or an event (an epoch
// bump) freed every lease.
func (s *Subscribers) SignalAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, chs := range s.subs {
		for ch := range chs {
			wake(ch)
		}
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
