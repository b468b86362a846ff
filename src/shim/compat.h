/*
 * libkgpu-limit.so is mounted from the node into container images whose C
 * library may be much older than the node's, and a preloaded library that
 * fails to load is skipped with a warning: no limits at all. So the library
 * needs nothing newer than glibc 2.17 (a CTest checks it):
 *
 * - glibc 2.34 moved the dl* and pthread_* functions into libc under new
 *   symbol versions; with KGPU_SHIM_PORTABLE (set for the library only)
 *   references bind to their original versions, which every glibc since
 *   still provides (the library also links libdl and libpthread, where
 *   older ones keep them);
 * - stat/fstat/lstat are versioned 2.33, so the shim asks the kernel
 *   directly (the kernel's struct stat is glibc's on x86-64 and arm64).
 */
#ifndef KGPU_SHIM_COMPAT_H
#define KGPU_SHIM_COMPAT_H

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef KGPU_SHIM_PORTABLE
#if defined(__x86_64__)
#define KGPU__OLD(sym, ver) __asm__(".symver " #sym "," #sym "@" ver)
#ifndef KGPU_SHIM_DEFINES_DLOPEN
KGPU__OLD(dlopen, "GLIBC_2.2.5");
#endif
KGPU__OLD(dlinfo, "GLIBC_2.3.3");
KGPU__OLD(dlclose, "GLIBC_2.2.5");
#ifndef KGPU_SHIM_DEFINES_DLVSYM
KGPU__OLD(dlvsym, "GLIBC_2.2.5");
#endif
KGPU__OLD(dladdr1, "GLIBC_2.3.3");
KGPU__OLD(pthread_once, "GLIBC_2.2.5");
KGPU__OLD(pthread_mutexattr_init, "GLIBC_2.2.5");
KGPU__OLD(pthread_mutexattr_destroy, "GLIBC_2.2.5");
KGPU__OLD(pthread_mutexattr_setpshared, "GLIBC_2.2.5");
KGPU__OLD(pthread_mutexattr_setrobust, "GLIBC_2.12");
KGPU__OLD(pthread_mutex_consistent, "GLIBC_2.12");
KGPU__OLD(pthread_mutex_timedlock, "GLIBC_2.2.5");
#elif defined(__aarch64__)
#define KGPU__OLD(sym, ver) __asm__(".symver " #sym "," #sym "@" ver)
#ifndef KGPU_SHIM_DEFINES_DLOPEN
KGPU__OLD(dlopen, "GLIBC_2.17");
#endif
KGPU__OLD(dlinfo, "GLIBC_2.17");
KGPU__OLD(dlclose, "GLIBC_2.17");
#ifndef KGPU_SHIM_DEFINES_DLVSYM
KGPU__OLD(dlvsym, "GLIBC_2.17");
#endif
KGPU__OLD(dladdr1, "GLIBC_2.17");
KGPU__OLD(pthread_once, "GLIBC_2.17");
KGPU__OLD(pthread_mutexattr_init, "GLIBC_2.17");
KGPU__OLD(pthread_mutexattr_destroy, "GLIBC_2.17");
KGPU__OLD(pthread_mutexattr_setpshared, "GLIBC_2.17");
KGPU__OLD(pthread_mutexattr_setrobust, "GLIBC_2.17");
KGPU__OLD(pthread_mutex_consistent, "GLIBC_2.17");
KGPU__OLD(pthread_mutex_timedlock, "GLIBC_2.17");
#endif
#endif

#if defined(__x86_64__)
_Static_assert(sizeof(struct stat) == 144, "glibc's struct stat is the kernel's");
#elif defined(__aarch64__)
_Static_assert(sizeof(struct stat) == 128, "glibc's struct stat is the kernel's");
#endif

/* fstat(2) without glibc's 2.33 symbol. */
static inline int kgpu_shim_fstat(int fd, struct stat *st)
{
    return (int)syscall(SYS_fstat, fd, st);
}

/* lstat(2) without glibc's 2.33 symbol. */
static inline int kgpu_shim_lstat(const char *path, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}

#endif
