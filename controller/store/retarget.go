package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
)

// sqlRetargetRepair renames an open repair's fault, compare-and-set on its
// state and reason ($2, $3), and audits it in the same statement: one row
// (the repair as changed) or none when the repair moved meanwhile.
// updated_at is kept: it is when the repair entered its state, the
// approval expiry clock.
const sqlRetargetRepair = `
WITH up AS (
    UPDATE repairs SET reason = $4, fault_class = $5, recommended_action = $6
    WHERE id = $1 AND state = $2 AND reason = $3 AND closed_at IS NULL
    RETURNING *),
audit AS (
    INSERT INTO repair_audit (repair_id, from_state, to_state, actor, reason, detail, at)
    SELECT id, state, state, $7, $8, $9, $10 FROM up)
SELECT ` + repairCols + ` FROM up r`

// Retarget is the fault an open repair is renamed to (RetargetRepair):
// the node's headline diagnosis's reason code, fault class and
// recommended action.
type Retarget struct {
	Reason, FaultClass, RecommendedAction string
}

// RetargetRepair sets the reason, fault class and recommended action of
// open repair rp (as the caller read it: ID, State, Reason) to to's, with
// an audit entry in the same transaction that keeps the state ("from
// PCIeFatalError to GPULost", by actor, for why; the old and new reason
// in its detail). The caller decides when (decide.Retarget); the
// toleration window, holds and approval clock stay as they are. Returns
// the changed repair. ErrConflict when the repair left rp.State or was
// renamed meanwhile (re-read it), ErrInvalid for an empty reason or actor,
// or a repair that is closed or deleting.
func (s *Store) RetargetRepair(ctx context.Context, rp Repair, to Retarget, actor, why string, now time.Time) (Repair, error) {
	switch {
	case to.Reason == "" || actor == "":
		return Repair{}, invalidf("retarget repair %d: reason and actor are required", rp.ID)
	case !ledger.Valid(rp.State) || ledger.Terminal(rp.State) || rp.State == ledger.Deleting:
		return Repair{}, invalidf("retarget repair %d: state %q is not before the deletion", rp.ID, rp.State)
	}
	detail, err := marshalOr(map[string]any{"from_reason": rp.Reason, "to_reason": to.Reason}, "{}")
	if err != nil {
		return Repair{}, invalidf("retarget repair %d: encode audit detail", rp.ID)
	}
	rows, _ := s.pool.Query(ctx, sqlRetargetRepair, rp.ID, string(rp.State), rp.Reason,
		to.Reason, to.FaultClass, to.RecommendedAction, actor, why, detail, now)
	out, err := pgx.CollectExactlyOneRow(rows, scanRepair)
	if errors.Is(err, pgx.ErrNoRows) {
		err = fmt.Errorf("repair %d is no longer %s for %s: %w", rp.ID, rp.State, rp.Reason, ErrConflict)
	}
	if err != nil {
		return Repair{}, errorf(err, "retarget repair %d", rp.ID)
	}
	return out, nil
}
