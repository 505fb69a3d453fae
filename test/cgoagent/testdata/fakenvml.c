/*
 * A stand-in libnvidia-ml.so.1 for test/cgoagent: the real agent binary
 * (built with cgo) dlopens it through go-nvml exactly as it would open the
 * driver's library, so the test covers loading, symbol resolution, struct
 * layout (compiled against go-nvml's own nvml.h) and the monitor's readings.
 * It implements only the calls agent/source/nvml makes. The GPUs it shows
 * are set by the environment:
 *   FAKE_NVML_GPUS          number of GPUs (default 1), PCI 0000:3b:00.0, 0000:3c:00.0, ...
 *   FAKE_NVML_DRIVER        driver version (default 550.54.15)
 *   FAKE_NVML_LOST          index of a GPU whose handle answers GPU_IS_LOST (Xid 79)
 *   FAKE_NVML_REMAP_PENDING index of a GPU with a row remapping pending
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "nvml.h"

static int envint(const char *name, int def) {
	const char *v = getenv(name);
	return v && *v ? atoi(v) : def;
}

/* go-nvml's nvml.h wraps the handle pointer in a one-member struct, passed
 * like the pointer of the driver's ABI. */
static int index_of(nvmlDevice_t d) { return (int)(intptr_t)d.handle - 1; }

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) {
	switch (r) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
	const char *v = getenv("FAKE_NVML_DRIVER");
	snprintf(version, length, "%s", v && *v ? v : "550.54.15");
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
	*n = (unsigned int)envint("FAKE_NVML_GPUS", 1);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
	if ((int)i >= envint("FAKE_NVML_GPUS", 1)) return NVML_ERROR_INVALID_ARGUMENT;
	if ((int)i == envint("FAKE_NVML_LOST", -1)) return NVML_ERROR_GPU_IS_LOST;
	d->handle = (struct nvmlDevice_st *)(intptr_t)(i + 1);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
	int i = index_of(d);
	memset(p, 0, sizeof *p);
	p->bus = 0x3b + i;
	p->pciDeviceId = 0x233010de;
	snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", 0x3b + i);
	snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", 0x3b + i);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
	snprintf(uuid, length, "GPU-fa4e0000-0000-0000-0000-%012d", index_of(d));
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
	(void)d;
	snprintf(name, length, "NVIDIA H100 80GB HBM3");
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *serial, unsigned int length) {
	snprintf(serial, length, "165422%07d", index_of(d));
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc, unsigned int *pending, unsigned int *failure) {
	int p = index_of(d) == envint("FAKE_NVML_REMAP_PENDING", -1);
	*corr = 0;
	*unc = p ? 1 : 0;
	*pending = p;
	*failure = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, nvmlMemoryErrorType_t t, nvmlEccCounterType_t c, unsigned long long *n) {
	(void)d; (void)t; (void)c;
	*n = 0;
	return NVML_SUCCESS;
}

/* A PCIe card: no NVLink (the monitor then reads no links). */
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *active) {
	(void)d; (void)link; (void)active;
	return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, nvmlEnableState_t *s) {
	(void)d;
	*s = NVML_FEATURE_DISABLED;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, nvmlPageRetirementCause_t c, unsigned int *count, unsigned long long *addrs) {
	(void)d; (void)c; (void)addrs;
	*count = 0;
	return NVML_SUCCESS;
}
