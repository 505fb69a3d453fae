package certs_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/certs"
)

// writePair writes a self-signed certificate for 127.0.0.1 named cn and its
// key, returning the certificate.
func writePair(t *testing.T, certFile, keyFile, cn string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

// TestReloadOnRotation: a server on Reloader serves HTTPS, and after the
// files are replaced (a renewed certificate) it serves the new pair without
// a restart; a broken file keeps the last good pair.
func TestReloadOnRotation(t *testing.T) {
	dir := t.TempDir()
	cf, kf := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := writePair(t, cf, kf, "first")
	rl, err := certs.New(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rl.Now = func() time.Time { return now }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }),
		TLSConfig: rl.ServerConfig()}
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	defer hs.Close()
	url := "https://" + ln.Addr().String()
	served := func(trust *x509.Certificate) error {
		pool := x509.NewCertPool()
		pool.AddCert(trust)
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := served(first); err != nil {
		t.Fatalf("first certificate: %v", err)
	}
	second := writePair(t, cf, kf, "second")
	now = now.Add(11 * time.Second)
	if err := served(second); err != nil {
		t.Fatalf("after rotation the new certificate is not served: %v", err)
	}
	if err := served(first); err == nil {
		t.Fatal("after rotation the old certificate is still served")
	}
	if err := os.WriteFile(cf, []byte("half-written"), 0o600); err != nil {
		t.Fatal(err)
	}
	now = now.Add(11 * time.Second)
	if err := served(second); err != nil {
		t.Fatalf("a broken file replaced the last good pair: %v", err)
	}
	if _, err := certs.New(cf, kf); err == nil {
		t.Fatal("New accepted a broken certificate file")
	}
}
