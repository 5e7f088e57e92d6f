/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The kernel tests/rocm/hsa_dispatch.c loads: a gfx90a code object built by Debian's clang-15
 * and lld-15 (`cargo xtask test` builds it beside hsa-dispatch as hsa-dispatch-kernel.hsaco):
 *
 *   clang-15 -x cl -cl-std=CL2.0 -target amdgcn-amd-amdhsa -mcpu=gfx90a -nogpulib -O2 -c
 *   ld.lld-15 -shared
 *
 * The emulated CP runs no ISA (tests/kfd-emu/README.md, "ROCm's packets"): what this kernel
 * would write is never checked. It is real code all the same, so that ROCr's loader, symbol
 * and kernarg paths run on a real code object (a code object v4 with its kernel descriptor
 * spin.kd). No device library is linked (-nogpulib): only compiler builtins are used.
 */
__kernel void spin(__global unsigned *out, unsigned tag)
{
	unsigned i = __builtin_amdgcn_workgroup_id_x() * 64 + __builtin_amdgcn_workitem_id_x();

	out[i] = tag;
}
