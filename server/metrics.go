package server

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the service's Prometheus collectors, registered on a registry of the Server's
// own (so that two Servers in one process do not collide).
type metrics struct {
	reg       *prometheus.Registry
	answers   *prometheus.CounterVec   // operation, outcome: "ok" or the problem type's last word
	refusals  *prometheus.CounterVec   // cause
	duration  *prometheus.HistogramVec // operation
	waits     *prometheus.HistogramVec // result: granted, busy, other
	waiters   prometheus.Gauge
	dbErrors  prometheus.Counter
	unknowns  prometheus.Counter
	acquired  prometheus.Counter
	busy      prometheus.Counter
	inflight  prometheus.Gauge
	handover  prometheus.Histogram
	startTime time.Time

	mu    sync.Mutex
	freed map[string]time.Time // when this service last freed each resource's lease
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), startTime: time.Now(), freed: map[string]time.Time{}}
	m.answers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenced_answers_total",
		Help: "Answers by operation and outcome (ok, or the problem type: busy, refused, not-provisioned, invalid, outcome-unknown, ...)."},
		[]string{"operation", "outcome"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fenced_refusals_total",
		Help: "Lease operations the database refused, by cause (advisory, as read after the refusal)."}, []string{"cause"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fenced_request_duration_seconds",
		Help: "Time to answer a request, by operation (waiting acquisitions included).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)},
		[]string{"operation"})
	m.waits = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fenced_wait_seconds",
		Help: "Time a waiting acquisition waited, by result (granted, busy, gone: the client hung up, other).", Buckets: prometheus.ExponentialBuckets(0.001, 2, 20)},
		[]string{"result"})
	m.waiters = prometheus.NewGauge(prometheus.GaugeOpts{Name: "fenced_waiters", Help: "Acquisitions waiting now."})
	m.dbErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenced_database_errors_total",
		Help: "Requests that failed on the database's side (5xx answers)."})
	m.unknowns = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenced_outcomes_unknown_total",
		Help: "Mutations whose outcome the service could not learn from its database."})
	m.acquired = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenced_acquisitions_total", Help: "Leases granted."})
	m.busy = prometheus.NewCounter(prometheus.CounterOpts{Name: "fenced_busy_total", Help: "Acquisitions answered busy."})
	m.handover = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fenced_handover_seconds",
		Help:    "From a lease freed through this service (release, publish and release) to the grant of a waiting acquisition of the same resource.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20)})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "fenced_requests_in_flight", Help: "Requests being answered now."})
	m.reg.MustRegister(m.answers, m.refusals, m.duration, m.waits, m.waiters, m.dbErrors, m.unknowns, m.acquired, m.busy, m.inflight, m.handover,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// recorder remembers what a handler answered, for the metrics.
type recorder struct {
	http.ResponseWriter
	status int
	prob   *Problem
	// finish counts and logs the answer; it runs when the handler returns, or, for a parked
	// waiter (parked set), once the waiter has answered on the connection it took over.
	finish func()
	parked bool
	gone   bool // a waiting client hung up before its answer; nothing was written
	// principal is the authenticated caller, for the handlers that filter their answer.
	principal *principal
	// requestID holds the Fenced-Request-Id header's value, so that it is not a slice of its own.
	requestID [1]string
}

// principalOf is the caller that handle authenticated for w's request.
func principalOf(w http.ResponseWriter) *principal {
	if rec, ok := w.(*recorder); ok {
		return rec.principal
	}
	return nil
}

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController and MaxBytesReader reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// observe counts one answer.
func (m *metrics) observe(op string, rec *recorder, took time.Duration) {
	outcome := "ok"
	if rec.prob != nil {
		outcome = rec.prob.Type[strings.LastIndexByte(rec.prob.Type, ':')+1:]
		switch rec.prob.Type {
		case TypeRefused, TypeNotProvisioned:
			if rec.prob.Cause != "" {
				m.refusals.WithLabelValues(rec.prob.Cause).Inc()
			}
		case TypeBusy:
			if op == "acquire" {
				m.busy.Inc()
			}
		case TypeOutcomeUnknown:
			m.unknowns.Inc()
		}
		if rec.prob.Status >= 500 {
			m.dbErrors.Inc()
		}
	} else if rec.gone {
		outcome = "client-gone"
	} else if op == "acquire" && rec.status == http.StatusOK {
		m.acquired.Inc()
	}
	m.answers.WithLabelValues(op, outcome).Inc()
	m.duration.WithLabelValues(op).Observe(took.Seconds())
}

// released notes that this service freed resource's lease (bounded: an entry is dropped when
// a waiter takes it, and the map is cleared if it grows past maxSeen).
func (m *metrics) released(resource string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.freed) >= maxSeen {
		clear(m.freed)
	}
	m.freed[resource] = time.Now()
}

// granted observes the handover to a waiter, if this service freed the lease it got.
func (m *metrics) granted(resource string) {
	m.mu.Lock()
	at, ok := m.freed[resource]
	delete(m.freed, resource)
	m.mu.Unlock()
	if ok {
		m.handover.Observe(time.Since(at).Seconds())
	}
}
