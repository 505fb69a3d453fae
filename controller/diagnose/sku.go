package diagnose

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
)

// InstanceType is what an instance type promises: how many GPUs, and how
// many NVLinks each GPU has wired to a peer or an NVSwitch. It decides
// whether "7 of 8 GPUs" or "links down" is a fault: a GPU count below GPUs
// is a lost GPU; an NVLink finding on a type with NVLinks 0 is a false
// positive (NVLinkNotApplicable), since NVML still lists the links of a
// GPU that is not wired to anything (an SXM part alone in a VM, a PCIe card
// without a bridge).
type InstanceType struct {
	// GPUs is the number of GPUs the type has (> 0).
	GPUs int `json:"gpus" yaml:"gpus"`
	// Model is the GPU model, for the operator (not used by the rules).
	Model string `json:"model,omitempty" yaml:"model"`
	// NVLinks is the number of NVLinks wired per GPU; 0: no NVLink.
	NVLinks int `json:"nvlinks" yaml:"nvlinks"`
	// NVSwitch is true when the GPUs' NVLinks go through NVSwitches (HGX
	// boards: the NVSwitch SXid and Fabric Manager rules apply).
	NVSwitch bool `json:"nvswitch,omitempty" yaml:"nvswitch"`
}

// DefaultInstanceTypes are the GPU instance types of AWS, Google Cloud and
// Azure that fleets run on, from each provider's published instance
// specifications (GPU count and model; NVLink per GPU from NVIDIA's data
// sheet of the model: H100/H200/B200 SXM 18, A100 SXM 12, V100 SXM2 6).
// Single-GPU slices of SXM boards (a2-highgpu-1g) and PCIe cards without a
// bridge (A10G, L4, L40S, T4) have no NVLink wired. The policy file's
// instanceTypes override or extend this table.
var DefaultInstanceTypes = map[string]InstanceType{
	// AWS.
	"p6-b200.48xlarge": {GPUs: 8, Model: "B200", NVLinks: 18, NVSwitch: true},
	"p5.48xlarge":      {GPUs: 8, Model: "H100", NVLinks: 18, NVSwitch: true},
	"p5e.48xlarge":     {GPUs: 8, Model: "H200", NVLinks: 18, NVSwitch: true},
	"p5en.48xlarge":    {GPUs: 8, Model: "H200", NVLinks: 18, NVSwitch: true},
	"p5.4xlarge":       {GPUs: 1, Model: "H100"},
	"p4d.24xlarge":     {GPUs: 8, Model: "A100", NVLinks: 12, NVSwitch: true},
	"p4de.24xlarge":    {GPUs: 8, Model: "A100", NVLinks: 12, NVSwitch: true},
	"p3.2xlarge":       {GPUs: 1, Model: "V100"},
	"p3.8xlarge":       {GPUs: 4, Model: "V100", NVLinks: 6},
	"p3.16xlarge":      {GPUs: 8, Model: "V100", NVLinks: 6},
	"p3dn.24xlarge":    {GPUs: 8, Model: "V100", NVLinks: 6},
	"g5.xlarge":        {GPUs: 1, Model: "A10G"},
	"g5.2xlarge":       {GPUs: 1, Model: "A10G"},
	"g5.4xlarge":       {GPUs: 1, Model: "A10G"},
	"g5.8xlarge":       {GPUs: 1, Model: "A10G"},
	"g5.16xlarge":      {GPUs: 1, Model: "A10G"},
	"g5.12xlarge":      {GPUs: 4, Model: "A10G"},
	"g5.24xlarge":      {GPUs: 4, Model: "A10G"},
	"g5.48xlarge":      {GPUs: 8, Model: "A10G"},
	"g6.xlarge":        {GPUs: 1, Model: "L4"},
	"g6.2xlarge":       {GPUs: 1, Model: "L4"},
	"g6.4xlarge":       {GPUs: 1, Model: "L4"},
	"g6.8xlarge":       {GPUs: 1, Model: "L4"},
	"g6.16xlarge":      {GPUs: 1, Model: "L4"},
	"g6.12xlarge":      {GPUs: 4, Model: "L4"},
	"g6.24xlarge":      {GPUs: 4, Model: "L4"},
	"g6.48xlarge":      {GPUs: 8, Model: "L4"},
	"g6e.xlarge":       {GPUs: 1, Model: "L40S"},
	"g6e.2xlarge":      {GPUs: 1, Model: "L40S"},
	"g6e.4xlarge":      {GPUs: 1, Model: "L40S"},
	"g6e.8xlarge":      {GPUs: 1, Model: "L40S"},
	"g6e.16xlarge":     {GPUs: 1, Model: "L40S"},
	"g6e.12xlarge":     {GPUs: 4, Model: "L40S"},
	"g6e.24xlarge":     {GPUs: 4, Model: "L40S"},
	"g6e.48xlarge":     {GPUs: 8, Model: "L40S"},
	"g4dn.xlarge":      {GPUs: 1, Model: "T4"},
	"g4dn.2xlarge":     {GPUs: 1, Model: "T4"},
	"g4dn.4xlarge":     {GPUs: 1, Model: "T4"},
	"g4dn.8xlarge":     {GPUs: 1, Model: "T4"},
	"g4dn.16xlarge":    {GPUs: 1, Model: "T4"},
	"g4dn.12xlarge":    {GPUs: 4, Model: "T4"},
	"g4dn.metal":       {GPUs: 8, Model: "T4"},
	// Google Cloud.
	"a3-megagpu-8g":  {GPUs: 8, Model: "H100", NVLinks: 18, NVSwitch: true},
	"a3-highgpu-8g":  {GPUs: 8, Model: "H100", NVLinks: 18, NVSwitch: true},
	"a3-ultragpu-8g": {GPUs: 8, Model: "H200", NVLinks: 18, NVSwitch: true},
	"a2-highgpu-1g":  {GPUs: 1, Model: "A100"},
	"a2-highgpu-8g":  {GPUs: 8, Model: "A100", NVLinks: 12, NVSwitch: true},
	"a2-megagpu-16g": {GPUs: 16, Model: "A100", NVLinks: 12, NVSwitch: true},
	"g2-standard-4":  {GPUs: 1, Model: "L4"},
	// Azure.
	"Standard_ND96asr_v4":       {GPUs: 8, Model: "A100", NVLinks: 12, NVSwitch: true},
	"Standard_ND96amsr_A100_v4": {GPUs: 8, Model: "A100", NVLinks: 12, NVSwitch: true},
	"Standard_ND96isr_H100_v5":  {GPUs: 8, Model: "H100", NVLinks: 18, NVSwitch: true},
	"Standard_NC24ads_A100_v4":  {GPUs: 1, Model: "A100"},
}

// mergeInstanceTypes returns DefaultInstanceTypes with the overrides
// applied (an override replaces the whole entry). It returns an error for
// an entry with no GPUs or negative links.
func mergeInstanceTypes(over map[string]InstanceType) (map[string]InstanceType, error) {
	out := make(map[string]InstanceType, len(DefaultInstanceTypes)+len(over))
	for k, v := range DefaultInstanceTypes {
		out[k] = v
	}
	for k, v := range over {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("instance type %s: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

// Validate returns an error when the expectation cannot be right: no GPUs,
// or a negative link count.
func (t InstanceType) Validate() error {
	if t.GPUs <= 0 {
		return fmt.Errorf("gpus must be > 0, got %d", t.GPUs)
	}
	if t.NVLinks < 0 {
		return fmt.Errorf("nvlinks must be >= 0, got %d", t.NVLinks)
	}
	return nil
}

// InstanceType returns the expectations of an instance type and whether
// the engine knows it.
func (e *Engine) InstanceType(name string) (InstanceType, bool) {
	t, ok := e.instanceTypes[name]
	return t, ok
}

// gpuCountReason decides a gpu-count finding. With the instance type known,
// its GPU count decides (the agent's --expected-gpus may be wrong or
// unset): found below it is a lost GPU, at or above it nothing. Without
// it, the agent's own "missing" stands.
func gpuCountReason(f *finding.Finding, sku *InstanceType) string {
	if sku != nil {
		found, err := strconv.Atoi(f.Attr(finding.AttrFound))
		if err == nil {
			if found < sku.GPUs {
				return catalog.ReasonGPULost
			}
			return ""
		}
	}
	if n, err := strconv.Atoi(f.Attr(finding.AttrMissing)); err == nil && n > 0 {
		return catalog.ReasonGPULost
	}
	return ""
}

// nvlinkGated reports whether an NVLink finding is a false positive on
// this instance type: the type is known and wires no NVLink.
func nvlinkGated(sku *InstanceType) bool { return sku != nil && sku.NVLinks == 0 }

// dcgmPolicyReason maps a DCGM policy violation (the host engine's pushed
// condition names, go-dcgm's PolicyCondition values) to a reason; "" for a
// condition these rules do not know (recorded as unparsed, no verdict).
func dcgmPolicyReason(f *finding.Finding, sku *InstanceType) string {
	switch c := strings.ToLower(f.Attr(finding.AttrCondition)); {
	case strings.HasPrefix(c, "double-bit ecc"):
		return catalog.ReasonUncorrectableECC
	case strings.HasPrefix(c, "max retired pages"):
		return catalog.ReasonRetiredPagesLimit
	case strings.HasPrefix(c, "nvlink"):
		if nvlinkGated(sku) {
			return catalog.ReasonNVLinkNotApplicable
		}
		return catalog.ReasonNVLinkError
	case strings.HasPrefix(c, "xid"):
		if f.Xid == 0 {
			return catalog.ReasonXidUnclassified
		}
		return xidReason(f.Xid)
	case strings.HasPrefix(c, "pci"):
		// DCGM's PCIe policy fires on the replay counter: corrected link
		// errors, an early warning.
		return catalog.ReasonPCIeCorrectableErrors
	case strings.HasPrefix(c, "thermal"), strings.HasPrefix(c, "power"):
		return catalog.ReasonGPUThermalOrPowerViolation
	}
	return ""
}

// RetiredPagesLimit is the number of retired pages (single- and double-bit
// together) at which a GPU without row remapping can retire no more:
// NVIDIA's dynamic page retirement retires at most 64 pages per GPU
// ("NVIDIA GPU memory error management", page retirement section).
const RetiredPagesLimit = 64

// retiredPagesReason maps an NVML retired-pages finding: at the limit the
// memory can no longer heal itself; a retirement pending needs a GPU reset
// (the page is retired at the next driver load), like a pending row remap.
func retiredPagesReason(f *finding.Finding) string {
	sbe, _ := strconv.Atoi(f.Attr(finding.AttrSBEPages))
	dbe, _ := strconv.Atoi(f.Attr(finding.AttrDBEPages))
	switch {
	case sbe+dbe >= RetiredPagesLimit:
		return catalog.ReasonRetiredPagesLimit
	case f.Attr(finding.AttrPending) == "true":
		return catalog.ReasonRowRemapPending
	}
	return ""
}

// inventoryFinding turns the heartbeat's GPU inventory into a gpu-count
// finding when the instance type is known and the inventory lists fewer
// GPUs than it promises: "7 of 8 GPUs" from boot on, whatever the agent's
// --expected-gpus says. No finding when the inventory is empty (NVML not
// started, the driver not loaded: other rules say why), when the agent
// already reported a gpu-count finding this boot, or when a GPU failed to
// initialise or a driver-class fault is on record (the missing GPU is that
// fault's, diagnosed there).
func inventoryFinding(in Input, sku *InstanceType, current []finding.Finding) (finding.Finding, bool) {
	if sku == nil || in.InventoryGPUs <= 0 || in.InventoryGPUs >= sku.GPUs {
		return finding.Finding{}, false
	}
	for _, f := range current {
		switch f.Detector {
		case finding.DetectorGPUCount, finding.DetectorRmInitFailed, finding.DetectorGSPFirmwareMissing,
			finding.DetectorDriverVersionMismatch:
			return finding.Finding{}, false
		case finding.DetectorXid:
			if f.Xid == 143 {
				return finding.Finding{}, false
			}
		}
	}
	// Untimed (the inventory is a state, not an event) and so one stable ID
	// for the same count: every reconcile reads the same finding.
	f := finding.Finding{Detector: finding.DetectorGPUCount, Node: in.Node, BootID: in.BootID, Count: 1,
		Attrs: map[string]string{finding.AttrFound: strconv.Itoa(in.InventoryGPUs), finding.AttrExpected: strconv.Itoa(sku.GPUs),
			finding.AttrMissing: strconv.Itoa(sku.GPUs - in.InventoryGPUs), finding.AttrSource: "heartbeat"},
		Evidence: []string{fmt.Sprintf("heartbeat inventory: %d of the %d GPUs the instance type %s has", in.InventoryGPUs, sku.GPUs, in.InstanceType)}}
	f.ID = finding.NewID(f)
	return f, true
}
