/*
 * Small tools every layer of the extender uses: its log (one line per call,
 * to stderr, at or below the configured level), the monotonic clock, and a
 * serialised malloc_trim for threads that just dropped a large parse tree.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "base.h"
#include "clock.h"

static atomic_int log_level = EXT_INFO;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

void ext_log_set_level(int level)
{
    atomic_store(&log_level, level);
}

void ext_log(int level, const char *fmt, ...)
{
    if (level > atomic_load(&log_level))
        return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char when[64];
    kgpu_rfc3339((double)ts.tv_sec + (double)ts.tv_nsec / 1e9, 3, when, sizeof(when));
    /* One write per line so concurrent threads never interleave inside a line. */
    pthread_mutex_lock(&log_mu);
    fprintf(stderr, "%s %-5s %s\n", when, names[level & 3], msg);
    pthread_mutex_unlock(&log_mu);
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
