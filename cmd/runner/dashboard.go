package runner

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/ui"
)

// Session lifetimes of the dashboard: a login lasts a working shift at most
// and ends after an idle hour.
const (
	sessionLifetime = 12 * time.Hour
	sessionIdle     = time.Hour
)

// dashboard wraps the API's routes in the dashboard (web/ui) with its login:
// OIDC when configured (its discovery document is fetched now, so a wrong
// issuer stops the start), the demo's local login when asked.
func dashboard(ctx context.Context, o Options, st *store.Store, svc *api.Service) (http.Handler, error) {
	var login *auth.OIDC
	if o.OIDC != nil {
		var err error
		if login, err = auth.NewOIDC(ctx, *o.OIDC); err != nil {
			return nil, err
		}
	}
	return ui.Handler(ui.Config{API: svc, APIHandler: svc.Handler(), OIDC: login, DevLogin: o.DevLogin,
		Sessions: auth.NewSessions(st.Sessions(o.Now), sessionLifetime, sessionIdle, o.SecureCookies), Now: o.Now, Log: o.Log})
}

// sweepSessions deletes expired login sessions every 10 minutes until ctx
// ends (every replica sweeps; the delete is idempotent).
func sweepSessions(ctx context.Context, st *store.Store, now func() time.Time, log *slog.Logger) error {
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := st.DeleteExpiredSessions(ctx, now()); err != nil && ctx.Err() == nil {
				log.WarnContext(ctx, "delete expired sessions", "err", err)
			}
		}
	}
}
