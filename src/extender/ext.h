/*
 * The whole kgpu-extender, for its tests, fuzz targets and benchmarks: every
 * layer's header. The extender's own files never include this one: each
 * includes its layer's (docs/architecture.md "The extender's layers").
 */
#ifndef KGPU_EXT_H
#define KGPU_EXT_H

#include "daemon.h"

#endif
