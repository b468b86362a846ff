/*
 * The hooks layer of libkgpu-limit.so, above account.h: what it offers is
 * the hooks themselves, whose exported prototypes are generated here from
 * hooks.def (CALL entries are not exported). The hooks_*.c files define
 * them; lookup.c, above, hands them out. Every CUDA hook starts with
 * KGPU_ENTER (driver.h).
 */
#ifndef KGPU_SHIM_HOOKS_H
#define KGPU_SHIM_HOOKS_H

#include "account.h"

#define KGPU__IF_HOOK(...) __VA_ARGS__
#define KGPU__IF_CALL(...)
#define X(lib, name, use, need, since, ret, params) KGPU__IF_##use(KGPU_EXPORT ret name params;)
#include "hooks.def"
#undef X

/*
 * hooks_measure.c, for the launch hooks: before a launch of f in the
 * current context, charges what the context's local memory must grow by
 * for it (CUDA_ERROR_OUT_OF_MEMORY: it does not fit, do not launch).
 */
CUresult kgpu__lmem_launch(CUfunction f);

#endif
