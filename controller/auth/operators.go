package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"gopkg.in/yaml.v3"
)

// Role is what a human operator may do (docs/design.md, decision 11).
type Role string

// Roles, each of viewer, approver and admin including the ones before it.
const (
	RoleViewer   Role = "viewer"   // read repair history
	RoleApprover Role = "approver" // approve or reject paused repairs
	RoleAdmin    Role = "admin"    // resume or reset breakers, kill switch
	// RoleReporter may only send job-failure reports (POST
	// /api/v1/job-reports): the token a Slurm epilog, a Kubeflow hook or a
	// CI job holds on many machines, so it reads nothing and decides
	// nothing. Approvers and admins may send job reports too; viewers may
	// not (a report moves a node towards a condition).
	RoleReporter Role = "reporter"
)

func (r Role) rank() int { return slices.Index([]Role{RoleViewer, RoleApprover, RoleAdmin}, r) }

// valid reports whether r is a known role.
func (r Role) valid() bool { return r.rank() >= 0 || r == RoleReporter }

// Allows reports whether role r includes role want.
func (r Role) Allows(want Role) bool {
	if want == RoleReporter {
		return r == RoleReporter || r.rank() >= RoleApprover.rank()
	}
	return r.rank() >= want.rank() && want.rank() >= 0
}

// Operator is an authenticated human.
type Operator struct {
	Name string `yaml:"name"`
	Role Role   `yaml:"role"`
	// TokenSHA256 is the hex SHA-256 of the operator's bearer token; the
	// file never holds the token itself.
	TokenSHA256 string `yaml:"tokenSHA256"`
}

// Operators authenticates humans by bearer token, from a tokens file. It is
// the mode before OIDC login (decision 11) and the demo's local login.
type Operators struct{ list []Operator }

// NewOperators validates a list of operators.
func NewOperators(list []Operator) (*Operators, error) {
	if len(list) == 0 {
		return nil, errors.New("no operators: nobody could approve, reject or resume anything")
	}
	seen, names := map[string]bool{}, map[string]bool{}
	for i, o := range list {
		if names[o.Name] {
			return nil, fmt.Errorf("operators[%d] (%s): name given twice", i, o.Name)
		}
		names[o.Name] = true
		switch {
		case o.Name == "":
			return nil, fmt.Errorf("operators[%d]: name required", i)
		case !o.Role.valid():
			return nil, fmt.Errorf("operators[%d] (%s): role %q is not viewer, approver, admin or reporter", i, o.Name, o.Role)
		case len(o.TokenSHA256) != 64:
			return nil, fmt.Errorf("operators[%d] (%s): tokenSHA256 must be 64 hex characters (sha256sum of the token)", i, o.Name)
		case seen[o.TokenSHA256]:
			return nil, fmt.Errorf("operators[%d] (%s): token shared with another operator", i, o.Name)
		}
		if _, err := hex.DecodeString(o.TokenSHA256); err != nil {
			return nil, fmt.Errorf("operators[%d] (%s): tokenSHA256 is not hex: %w", i, o.Name, err)
		}
		seen[o.TokenSHA256] = true
	}
	return &Operators{list: slices.Clone(list)}, nil
}

// LoadOperators reads a YAML list of operators (strict: unknown keys are
// errors naming the line).
func LoadOperators(path string) (*Operators, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read operators file: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var list []Operator
	if err := dec.Decode(&list); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("operators file %s: %w", path, err)
	}
	ops, err := NewOperators(list)
	if err != nil {
		// Name the line of the offending entry.
		var root yaml.Node
		if yaml.Unmarshal(b, &root) == nil && len(root.Content) == 1 && root.Content[0].Kind == yaml.SequenceNode {
			var i int
			if _, serr := fmt.Sscanf(err.Error(), "operators[%d]", &i); serr == nil && i < len(root.Content[0].Content) {
				return nil, fmt.Errorf("operators file %s: line %d: %w", path, root.Content[0].Content[i].Line, err)
			}
		}
		return nil, fmt.Errorf("operators file %s: %w", path, err)
	}
	return ops, nil
}

// TokenHash returns the hex SHA-256 of a token, as the operators file holds it.
func TokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// Authenticate returns the operator holding token, or an error wrapping
// ErrUnauthenticated.
func (o *Operators) Authenticate(token string) (Operator, error) {
	if o == nil || token == "" {
		return Operator{}, fmt.Errorf("no operator token: %w", ErrUnauthenticated)
	}
	h := TokenHash(token)
	for _, op := range o.list {
		if subtle.ConstantTimeCompare([]byte(h), []byte(op.TokenSHA256)) == 1 {
			return op, nil
		}
	}
	return Operator{}, fmt.Errorf("unknown operator token: %w", ErrUnauthenticated)
}
