package api

import (
	"crypto/tls"
	"log/slog"
	"net/http"
	"time"
)

// Server timeouts and limits (issue 11: 3,000 slow-body connections were
// held 90 s and a 1 MiB header was accepted).
const (
	// DefaultReadHeaderTimeout bounds reading a request's headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout bounds reading a whole request, body included: a
	// 4 MiB report (MaxReportBytes) at 1 Mbit/s takes 32 s.
	DefaultReadTimeout = 45 * time.Second
	// DefaultWriteTimeout bounds a request from the end of its headers to
	// the end of the answer: the shadow report may compute for minutes
	// (the CLI waits 5 minutes by default).
	DefaultWriteTimeout = 6 * time.Minute
	// DefaultIdleTimeout closes keep-alive connections idle this long.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxHeaderBytes bounds a request's headers (a bearer token
	// of a projected ServiceAccount is about 1 KiB).
	DefaultMaxHeaderBytes = 64 << 10
)

// ServerOptions configures NewServer; zero fields take the defaults.
type ServerOptions struct {
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                                            int
	// TLS, when set, is the server's TLS configuration (serve with
	// ServeTLS(ln, "", "")); see controller/certs for reloaded files.
	TLS *tls.Config
	Log *slog.Logger
}

// NewServer returns the http.Server for handler h with every timeout and the
// header limit set: a slow or stalled client holds a connection for at most
// ReadTimeout, never for ever.
func NewServer(h http.Handler, o ServerOptions) *http.Server {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&o.ReadTimeout, DefaultReadTimeout)
	def(&o.WriteTimeout, DefaultWriteTimeout)
	def(&o.IdleTimeout, DefaultIdleTimeout)
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: o.ReadHeaderTimeout, ReadTimeout: o.ReadTimeout,
		WriteTimeout: o.WriteTimeout, IdleTimeout: o.IdleTimeout, MaxHeaderBytes: o.MaxHeaderBytes, TLSConfig: o.TLS}
	if o.Log != nil {
		srv.ErrorLog = slog.NewLogLogger(o.Log.Handler(), slog.LevelDebug) // TLS handshake noise from scanners
	}
	return srv
}
