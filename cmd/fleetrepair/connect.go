package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetrepair/fleetrepair/web/apiclient"
)

// defaultServer is the controller URL when nothing else names one.
const defaultServer = "http://127.0.0.1:8080"

// Config is the client configuration file, ~/.config/fleetrepair/config.yaml
// ($XDG_CONFIG_HOME/fleetrepair/config.yaml; --config or FLEETREPAIR_CLIENT_CONFIG
// name another): named contexts, each a way to reach one controller, and the
// current one. docs/cli.md documents it.
type Config struct {
	CurrentContext string    `yaml:"current-context"`
	Contexts       []Context `yaml:"contexts"`
}

// Context is one controller: either Server, its URL, or KubeContext, a
// context of a kubeconfig through whose API server (its service proxy) the
// controller's Service is reached with that context's credentials, no
// port-forward needed. The operator token is Token, or read from TokenFile.
type Context struct {
	Name   string `yaml:"name"`
	Server string `yaml:"server,omitempty"`
	// Token is an operator token; prefer TokenFile (~ expands) or
	// FLEETREPAIR_TOKEN, which keep it out of the file.
	Token     string `yaml:"token,omitempty"`
	TokenFile string `yaml:"token-file,omitempty"`
	// KubeContext names a context of Kubeconfig (default $KUBECONFIG, else
	// ~/.kube/config); "" with Server unset means that file's current context.
	KubeContext string `yaml:"kube-context,omitempty"`
	Kubeconfig  string `yaml:"kubeconfig,omitempty"`
	// Namespace, Service, Port and Scheme locate the controller's Service
	// (default fleetrepair, fleetrepair-controller, http, http: the Helm
	// chart's; Scheme https when the controller serves TLS).
	Namespace string `yaml:"namespace,omitempty"`
	Service   string `yaml:"service,omitempty"`
	Port      string `yaml:"port,omitempty"`
	Scheme    string `yaml:"scheme,omitempty"`
}

// connection is the flags every client command shares.
type connection struct {
	server, token, context, kubeContext, config string
}

// addConnectionFlags registers the connection flags on cmd (persistent, so
// subcommands have them) and returns where they land.
func addConnectionFlags(cmd *cobra.Command) *connection {
	c := &connection{}
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.server, "server", "", "controller base URL (env FLEETREPAIR_SERVER; default: the context's, else "+defaultServer+")")
	pf.StringVar(&c.token, "token", "", "your operator token (env FLEETREPAIR_TOKEN; default: the context's)")
	pf.StringVar(&c.context, "context", "", "context of the config file to use (env FLEETREPAIR_CONTEXT; default: its current-context)")
	pf.StringVar(&c.kubeContext, "kube-context", "", "reach the controller through this kubeconfig context's API server (service proxy) instead of a URL")
	pf.StringVar(&c.config, "config", "", "client config file (env FLEETREPAIR_CLIENT_CONFIG; default ~/.config/fleetrepair/config.yaml)")
	return c
}

// configPath is the config file to read: --config, FLEETREPAIR_CLIENT_CONFIG, else
// $XDG_CONFIG_HOME/fleetrepair/config.yaml (os.UserConfigDir). explicit
// reports that the user named it, so a missing one is an error.
func (c *connection) configPath() (path string, explicit bool) {
	if c.config != "" {
		return c.config, true
	}
	if v := os.Getenv("FLEETREPAIR_CLIENT_CONFIG"); v != "" {
		return v, true
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", false
	}
	return filepath.Join(dir, "fleetrepair", "config.yaml"), false
}

// loadConfig reads the config file; a missing default file is an empty
// config.
func (c *connection) loadConfig() (Config, string, error) {
	path, explicit := c.configPath()
	if path == "" {
		return Config{}, "", nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return Config{}, "", nil
	}
	if err != nil {
		return Config{}, path, fmt.Errorf("read client config: %w", err)
	}
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, path, fmt.Errorf("parse client config %s: %w", path, err)
	}
	return cfg, path, nil
}

// target is where a command's calls go and with what.
type target struct {
	server string
	token  string
	http   *http.Client // nil: the default transport
	// via says how the server was chosen, for error messages and `-v`.
	via string
}

// resolve picks the controller and token. The server: --server, else
// FLEETREPAIR_SERVER, else --kube-context, else the config file's context
// (--context, FLEETREPAIR_CONTEXT, its current-context), else the local
// default. The token: --token, else FLEETREPAIR_TOKEN, else the context's.
func (c *connection) resolve() (target, error) {
	cfg, path, err := c.loadConfig()
	if err != nil {
		return target{}, err
	}
	name := c.context
	if name == "" {
		name = os.Getenv("FLEETREPAIR_CONTEXT")
	}
	if name == "" {
		name = cfg.CurrentContext
	}
	var ctx *Context
	if name != "" {
		for i := range cfg.Contexts {
			if cfg.Contexts[i].Name == name {
				ctx = &cfg.Contexts[i]
			}
		}
		if ctx == nil {
			names := make([]string, 0, len(cfg.Contexts))
			for _, x := range cfg.Contexts {
				names = append(names, x.Name)
			}
			return target{}, fmt.Errorf("context %q is not in the client config %s (it has: %s)", name, orNone(path), strings.Join(names, ", "))
		}
	}
	var t target
	switch server := strings.TrimSpace(os.Getenv("FLEETREPAIR_SERVER")); {
	case c.server != "":
		t.server, t.via = c.server, "--server"
	case server != "":
		t.server, t.via = server, "FLEETREPAIR_SERVER"
	case c.kubeContext != "":
		kc := Context{KubeContext: c.kubeContext}
		if ctx != nil && ctx.KubeContext == c.kubeContext {
			kc = *ctx
		}
		if t, err = kubeTarget(kc); err != nil {
			return target{}, err
		}
	case ctx != nil && ctx.Server != "":
		t.server, t.via = ctx.Server, "context "+ctx.Name
	case ctx != nil:
		if t, err = kubeTarget(*ctx); err != nil {
			return target{}, fmt.Errorf("context %s: %w", ctx.Name, err)
		}
		t.via = "context " + ctx.Name + " (" + t.via + ")"
	default:
		t.server, t.via = defaultServer, "the default"
	}
	switch {
	case c.token != "":
		t.token = c.token
	case os.Getenv("FLEETREPAIR_TOKEN") != "":
		t.token = os.Getenv("FLEETREPAIR_TOKEN")
	case ctx != nil && ctx.Token != "":
		t.token = ctx.Token
	case ctx != nil && ctx.TokenFile != "":
		b, err := os.ReadFile(expandHome(ctx.TokenFile))
		if err != nil {
			return target{}, fmt.Errorf("context %s: read token-file: %w", ctx.Name, err)
		}
		t.token = strings.TrimSpace(string(b))
	}
	return t, nil
}

// kubeTarget reaches the controller's Service through the API server of
// kubeconfig context k.KubeContext: the URL is the service proxy
// (/api/v1/namespaces/NS/services/SCHEME:NAME:PORT/proxy) and the HTTP
// client carries that context's credentials (client certificate, token, exec
// plugin) as kubectl would. The caller needs get on services/proxy there.
func kubeTarget(k Context) (target, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if k.Kubeconfig != "" {
		rules.ExplicitPath = expandHome(k.Kubeconfig)
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: k.KubeContext}).ClientConfig()
	if err != nil {
		return target{}, fmt.Errorf("load kubeconfig context %q: %w", k.KubeContext, err)
	}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return target{}, fmt.Errorf("kubeconfig context %q: %w", k.KubeContext, err)
	}
	ns, svc, port, scheme := or(k.Namespace, "fleetrepair"), or(k.Service, "fleetrepair-controller"), or(k.Port, "http"), or(k.Scheme, "http")
	base, err := url.Parse(rc.Host)
	if err != nil || base.Host == "" {
		base, err = url.Parse("https://" + rc.Host)
		if err != nil {
			return target{}, fmt.Errorf("kubeconfig context %q: server %q: %w", k.KubeContext, rc.Host, err)
		}
	}
	base = base.JoinPath(rc.APIPath, "api/v1/namespaces", ns, "services", scheme+":"+svc+":"+port, "proxy")
	name := k.KubeContext
	if name == "" {
		name = "current"
	}
	return target{server: base.String(), http: hc, via: "kubeconfig context " + name + ", service " + ns + "/" + svc}, nil
}

// client returns the API client for a command's connection flags.
func (c *connection) client() (*apiclient.Client, target, error) {
	t, err := c.resolve()
	if err != nil {
		return nil, t, err
	}
	if u, err := url.Parse(t.server); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, t, fmt.Errorf("connect: server %q (from %s) is not an http:// or https:// URL, e.g. https://fleetrepair.example.com", t.server, t.via)
	}
	cl, err := apiclient.New(t.server, apiclient.Options{Token: t.token, HTTPClient: t.http, Proxied: t.http != nil})
	return cl, t, err
}

func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if h, err := os.UserHomeDir(); err == nil {
			return filepath.Join(h, rest)
		}
	}
	return p
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// again is the connection flags the user gave, to repeat in a command
// line the output suggests (never the token).
func (c *connection) again() string {
	var s string
	for _, f := range []struct{ name, v string }{{"context", c.context}, {"kube-context", c.kubeContext}, {"server", c.server}, {"config", c.config}} {
		if f.v != "" {
			s += " --" + f.name + " " + quote(f.v)
		}
	}
	return s
}

// reachErr adds to a failed call how the server was chosen and how to
// choose another, when the controller could not be reached at all.
func reachErr(t target, err error) error {
	var ue *url.Error
	if err == nil || !errors.As(err, &ue) {
		return err
	}
	return fmt.Errorf("%w\n(server %s, from %s: set --server, FLEETREPAIR_SERVER, --context or --kube-context; see docs/cli.md)", err, t.server, t.via)
}
