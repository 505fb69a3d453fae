// Package certs serves TLS from certificate files that rotate (cert-manager,
// a mounted Secret): the key pair is re-read when either file changes, so a
// renewed certificate is served without a restart.
package certs

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// checkEvery is how often, at most, the files are checked for a change (one
// stat per file per handshake at most this often).
const checkEvery = 10 * time.Second

// Reloader holds the key pair of CertFile and KeyFile (PEM) and re-reads it
// when either file's modification time or size changes.
type Reloader struct {
	CertFile, KeyFile string
	// Now is the clock of the change checks (default time.Now).
	Now func() time.Time

	mu        sync.Mutex
	cert      *tls.Certificate
	stamp     string
	checkedAt time.Time
}

// New loads the key pair; an error names the file that could not be read.
func New(certFile, keyFile string) (*Reloader, error) {
	r := &Reloader{CertFile: certFile, KeyFile: keyFile}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Reloader) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reloader) fileStamp() (string, error) {
	s := ""
	for _, p := range []string{r.CertFile, r.KeyFile} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("stat tls file: %w", err)
		}
		s += fmt.Sprintf("%s:%d:%d;", p, fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}

func (r *Reloader) load() error {
	stamp, err := r.fileStamp()
	if err != nil {
		return err
	}
	c, err := tls.LoadX509KeyPair(r.CertFile, r.KeyFile)
	if err != nil {
		return fmt.Errorf("load tls key pair %s, %s: %w", r.CertFile, r.KeyFile, err)
	}
	r.mu.Lock()
	r.cert, r.stamp, r.checkedAt = &c, stamp, r.now()
	r.mu.Unlock()
	return nil
}

// GetCertificate implements tls.Config.GetCertificate. A change that cannot
// be loaded (a half-written file) keeps the previous pair and is tried
// again at the next check.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	due := r.now().Sub(r.checkedAt) >= checkEvery
	if due {
		r.checkedAt = r.now()
	}
	cert, stamp := r.cert, r.stamp
	r.mu.Unlock()
	if due {
		if s, err := r.fileStamp(); err == nil && s != stamp {
			if err := r.load(); err == nil {
				r.mu.Lock()
				cert = r.cert
				r.mu.Unlock()
			}
		}
	}
	return cert, nil
}

// ServerConfig returns a TLS configuration (TLS 1.2 or newer) serving r's
// key pair.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}
