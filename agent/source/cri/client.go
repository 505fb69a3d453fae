package cri

import (
	"context"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Dial returns a Runtime speaking CRI v1 over the unix socket at path. The
// connection is made lazily, per call, so a runtime that restarts is
// reached again without any bookkeeping; the socket's absence is reported
// as fs.ErrNotExist.
func Dial(path string) Runtime { return &client{path: path} }

type client struct {
	path string
	conn *grpc.ClientConn
	svc  runtimeapi.RuntimeServiceClient
}

func (c *client) service() (runtimeapi.RuntimeServiceClient, error) {
	if _, err := os.Stat(c.path); err != nil {
		return nil, fmt.Errorf("stat cri socket: %w", err)
	}
	if c.svc != nil {
		return c.svc, nil
	}
	conn, err := grpc.NewClient("passthrough:///"+c.path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.path)
		}))
	if err != nil {
		return nil, fmt.Errorf("dial cri socket: %w", err)
	}
	c.conn, c.svc = conn, runtimeapi.NewRuntimeServiceClient(conn)
	return c.svc, nil
}

func (c *client) Version(ctx context.Context) (string, string, error) {
	svc, err := c.service()
	if err != nil {
		return "", "", err
	}
	r, err := svc.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", "", fmt.Errorf("cri version: %w", err)
	}
	return r.GetRuntimeName(), r.GetRuntimeVersion(), nil
}

func (c *client) Status(ctx context.Context) ([]Condition, error) {
	svc, err := c.service()
	if err != nil {
		return nil, err
	}
	r, err := svc.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("cri status: %w", err)
	}
	var out []Condition
	for _, c := range r.GetStatus().GetConditions() {
		out = append(out, Condition{Type: c.GetType(), Status: c.GetStatus(), Reason: c.GetReason(), Message: c.GetMessage()})
	}
	return out, nil
}
