package load

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// stopList is what the harness started, to stop in reverse order when it
// receives SIGINT or SIGTERM (stopOnSignal). Safe for concurrent use.
type stopList struct {
	mu  sync.Mutex
	fns []func()
}

// add registers fn, which stops one thing the harness started; it must be
// safe to call as well as the test's own cleanup (envtest.Env.Stop and
// pgtemp.Server.Stop are idempotent).
func (s *stopList) add(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fns = append(s.fns, fn)
}

// run calls every registered function, the last registered first.
func (s *stopList) run() {
	s.mu.Lock()
	fns := s.fns
	s.fns = nil
	s.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// stopOnSignal, until the returned function is called, answers SIGINT and
// SIGTERM (Ctrl-C, timeout) by logging, stopping everything in stops
// (controllers, API servers and PostgreSQL shut down and their temporary
// folders removed, which the test's cleanups would do but a signal never
// reaches) and calling exit with 128 + the signal's number. The children's
// parent-death signals (startReplica, test/pgtemp, test/parentdeath) are
// what stops them when the harness dies without a signal it can catch.
func stopOnSignal(stops *stopList, logf func(string, ...any), exit func(int)) (cancel func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case <-done:
			return
		case sig := <-sigs:
			logf("received %s: stopping the controllers, the API servers and PostgreSQL", sig)
			stops.run()
			n := 1
			if s, ok := sig.(syscall.Signal); ok {
				n = int(s)
			}
			exit(128 + n)
		}
	}()
	return func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(done)
		})
	}
}
