/*
 * A stand-in for the ROCm runtime's doorbell-ring exports, for the doorbell probe's tests and the
 * native harness: built as `libhsa-runtime64.so.1` (the name the probe looks for in
 * /proc/PID/maps), with the signatures of ROCR-Runtime's hsa.h. A store writes the value to the
 * u64 the handle points at (the tests and the harness pass the address of a word of theirs, as
 * ROCr's handle is the address of its amd_signal_t), so the call does real work and cannot be
 * folded away; the uprobe sits on the function's first instruction either way.
 */
#include <stdint.h>

typedef struct hsa_signal_s {
	uint64_t handle;
} hsa_signal_t;

typedef int64_t hsa_signal_value_t;

__attribute__((visibility("default"), noinline)) void hsa_signal_store_screlease(hsa_signal_t signal,
										  hsa_signal_value_t value)
{
	if (signal.handle)
		__atomic_store_n((int64_t *)(uintptr_t)signal.handle, value, __ATOMIC_RELEASE);
}

/* ROCr exports `_release` as an alias of `_screlease` (one address). */
__attribute__((visibility("default"), alias("hsa_signal_store_screlease"))) void
hsa_signal_store_release(hsa_signal_t signal, hsa_signal_value_t value);

__attribute__((visibility("default"), noinline)) void hsa_signal_store_relaxed(hsa_signal_t signal,
										hsa_signal_value_t value)
{
	if (signal.handle)
		__atomic_store_n((int64_t *)(uintptr_t)signal.handle, value, __ATOMIC_RELAXED);
}
