package diagnose

import "github.com/fleetrepair/fleetrepair/controller/catalog"

// xidReason maps an NVIDIA Xid number to a reason code. The mapping follows
// our summary of NVIDIA's Xid catalog ("Analyzing Xid Errors with the Xid
// Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
// kept in cases/xid-actions.md. Xid 45 and 154 are resolved by
// the rules (attribution to the preceding Xid; the recovery-action text).
// Numbers absent here map to XidUnclassified: recorded, never repaired on.
func xidReason(xid int) string {
	switch {
	case xid >= 144 && xid <= 150:
		return catalog.ReasonNVLinkError // NVLink5 unit errors (Blackwell)
	case xid >= 1 && xid <= 7, xid == 9, xid == 10, xid == 12:
		return catalog.ReasonXidInformational // legacy FIFO/graphics codes, not expected on A100+
	}
	switch xid {
	case 8, 11, 13, 31, 32, 43, 45, 68, 69, 80, 94:
		return catalog.ReasonXidApplicationError
	case 38, 44, 61, 92, 121, 137, 157:
		return catalog.ReasonXidInformational
	case 46, 109, 110, 136, 155, 156:
		return catalog.ReasonGPUHang
	case 48:
		return catalog.ReasonUncorrectableECC
	case 54:
		return catalog.ReasonGPUPowerFault
	case 62, 119, 120:
		return catalog.ReasonGPUFirmwareError
	case 63:
		return catalog.ReasonRowRemapPending
	case 64:
		return catalog.ReasonRowRemapFailure
	case 74:
		return catalog.ReasonNVLinkError
	case 79:
		return catalog.ReasonGPULost
	case 95, 140:
		return catalog.ReasonUncontainedMemoryError
	case 143:
		return catalog.ReasonGPUInitFailed
	case 151:
		return catalog.ReasonConfidentialComputingFault
	}
	return catalog.ReasonXidUnclassified
}

// recoveryAction maps the Xid 154 recovery-action attribute to the action
// the driver requires. The Xid 154 text is authoritative (xid-actions.md).
func recoveryAction(a string) (catalog.Action, bool) {
	switch a {
	case "gpu-reset-required", "drain-and-reset", "drain-p2p":
		return catalog.ActionResetGPU, true
	case "node-reboot-required":
		return catalog.ActionReboot, true
	}
	return catalog.ActionNone, false
}
