/*
 * The lookup layer of libkgpu-limit.so, above hooks.h: the table of hooks
 * generated from hooks.def, with dlsym, dlvsym and cuGetProcAddress, which
 * hand them out (lookup.c). What it offers the loader above is the hook of
 * a name.
 */
#ifndef KGPU_SHIM_LOOKUP_H
#define KGPU_SHIM_LOOKUP_H

#include "hooks.h"

/* The hook called `name` (without dlsym's lookup of the driver), or NULL. */
void *kgpu__hook_named(const char *name);

#endif
