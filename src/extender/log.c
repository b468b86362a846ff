/*
 * Small tools every layer of the extender uses: its log (src/common's
 * kgpu_log, with the extender's levels and millisecond times), the
 * monotonic clock, and a serialised malloc_trim for threads that just
 * dropped a large parse tree.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "base.h"
#include "clock.h"
#include "log.h"

/* The extender's lines keep their millisecond times, whichever call comes first. */
static pthread_once_t format_once = PTHREAD_ONCE_INIT;

static void set_format(void)
{
    kgpu_log_set_format(3, "");
}

void ext_log_set_level(int level)
{
    pthread_once(&format_once, set_format);
    /* 0 error .. 3 debug, as the configuration counts; below 0 nothing at all. */
    kgpu_log_set_level(level < 0 ? (kgpu_log_level)(KGPU_LOG_ERROR + 1)
                                 : (kgpu_log_level)(KGPU_LOG_ERROR - (level > 3 ? 3 : level)));
}

void ext_log(int level, const char *fmt, ...)
{
    pthread_once(&format_once, set_format);
    va_list ap;
    va_start(ap, fmt);
    kgpu_vlog((kgpu_log_level)(KGPU_LOG_ERROR - (level & 3)), fmt, ap);
    va_end(ap);
}

double ext_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * malloc_trim(0) for the reflectors' large transient lists, one call at a
 * time. glibc's malloc_trim initialises its arena lazily, and two threads
 * making the first call at once can walk bins not yet set up: under
 * AddressSanitizer, whose allocator leaves glibc's untouched until then, the
 * node and the DRA claim reflectors' first lists crashed the extender so.
 */
void ext_malloc_trim(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    malloc_trim(0);
    pthread_mutex_unlock(&mu);
}
