// Package hostroot maps host paths (/sys, /proc, /dev, /run) to where the
// agent sees them: "/" on a node, "/host" when the host's file system is
// mounted into the agent's container, a testdata tree in tests. Every source
// takes its paths through one Root, so one setting moves them all.
package hostroot

import (
	"os"
	"path/filepath"
	"strings"
)

// Root is the host's root directory as the agent sees it. The zero value
// means "/".
type Root string

// Path returns the agent-side path of the host path p (absolute).
func (r Root) Path(p string) string {
	if r == "" || r == "/" {
		return p
	}
	return filepath.Join(string(r), p)
}

// ReadString reads the host file p and returns its content without
// surrounding white space.
func (r Root) ReadString(p string) (string, error) {
	b, err := os.ReadFile(r.Path(p))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
