/*
 * A stand-in for the ROCm runtime's doorbell-ring exports, for the doorbell probe's tests and the
 * native harness: built as `libhsa-runtime64.so.1` (the name the probe looks for in
 * /proc/PID/maps), with the signatures of ROCR-Runtime's hsa.h. A store writes the value to the
 * u64 the handle points at (the tests and the harness pass the address of a word of theirs, as
 * ROCr's handle is the address of its amd_signal_t), so the call does real work and cannot be
 * folded away.
 *
 * Shaped as ROCr ships them, because where the uprobe can sit and what a hit costs depend on it:
 * each export is a thunk through the runtime's API table (hsa_table_interface.cpp:
 * `coreApiTable->hsa_signal_store_screlease_fn(signal, value)`, compiled to
 * `mov coreApiTable(%rip),%rax; jmp *off(%rax)`), filled when the library loads, and the
 * implementation it jumps to begins by saving registers (Debian's ROCr 5.2 and trixie's 6.1:
 * `push %rbp; push %rbx; sub $8,%rsp`, after 6.1's `endbr64`), which the probe sits on.
 */
#include <stdint.h>

typedef struct hsa_signal_s {
	uint64_t handle;
} hsa_signal_t;

typedef int64_t hsa_signal_value_t;

typedef void (*store_fn)(hsa_signal_t, hsa_signal_value_t);

/* The part of the API table the exports use (ROCr's has every API function, in this order). */
struct core_api_table {
	store_fn store_relaxed;
	store_fn store_screlease;
};

static void store_relaxed_impl(hsa_signal_t signal, hsa_signal_value_t value)
{
	/* The implementation's first instruction is a push, as ROCr's is (see above). */
	__asm__ volatile("push %%rbp\n\tpop %%rbp" ::: "memory");
	if (signal.handle)
		__atomic_store_n((int64_t *)(uintptr_t)signal.handle, value, __ATOMIC_RELAXED);
}

static void store_screlease_impl(hsa_signal_t signal, hsa_signal_value_t value)
{
	__asm__ volatile("push %%rbp\n\tpop %%rbp" ::: "memory");
	if (signal.handle)
		__atomic_store_n((int64_t *)(uintptr_t)signal.handle, value, __ATOMIC_RELEASE);
}

static struct core_api_table table;
/* Set when the library loads, as ROCr's is: the exports load it and jump through it. */
__attribute__((visibility("hidden"))) struct core_api_table *core_api_table_pointer;

__attribute__((constructor)) static void fill_api_table(void)
{
	table.store_relaxed = store_relaxed_impl;
	table.store_screlease = store_screlease_impl;
	core_api_table_pointer = &table;
}

__attribute__((visibility("default"), noinline)) void hsa_signal_store_screlease(hsa_signal_t signal,
										  hsa_signal_value_t value)
{
	core_api_table_pointer->store_screlease(signal, value);
}

/* ROCr exports `_release` as an alias of `_screlease` (one address). */
__attribute__((visibility("default"), alias("hsa_signal_store_screlease"))) void
hsa_signal_store_release(hsa_signal_t signal, hsa_signal_value_t value);

__attribute__((visibility("default"), noinline)) void hsa_signal_store_relaxed(hsa_signal_t signal,
										hsa_signal_value_t value)
{
	core_api_table_pointer->store_relaxed(signal, value);
}
