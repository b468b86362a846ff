/*
 * kgpu's log lines (log.h): formatted first, then written with one call
 * under a mutex, so concurrent threads never interleave inside a line and a
 * slow stderr never holds a lock while formatting.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "log.h"

static atomic_int level = KGPU_LOG_INFO;
static int digits = 9;
static char prefix[64];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

void kgpu_log_set_level(kgpu_log_level l)
{
    atomic_store(&level, (int)l);
}

kgpu_log_level kgpu_log_get_level(void)
{
    return (kgpu_log_level)atomic_load(&level);
}

static const char *const names[] = {"debug", "info", "warn", "error"};

int kgpu_log_level_parse(const char *name, kgpu_log_level *out)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (kgpu_log_level)i;
            return 0;
        }
    return -1;
}

void kgpu_log_set_format(int time_digits, const char *pre)
{
    digits = time_digits < 0 ? 0 : time_digits > 9 ? 9 : time_digits;
    snprintf(prefix, sizeof(prefix), "%s", pre != NULL ? pre : "");
}

void kgpu_vlog(kgpu_log_level l, const char *fmt, va_list args)
{
    if ((int)l < atomic_load(&level) || (int)l < 0 || (int)l > KGPU_LOG_ERROR)
        return;
    char when[64];
    if (digits == 9) {
        kgpu_rfc3339_now(when, sizeof(when)); /* exact: a double cannot hold nanoseconds */
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        kgpu_rfc3339((double)ts.tv_sec + (double)ts.tv_nsec / 1e9, digits, when, sizeof(when));
    }
    /* Most lines fit the stack; a longer one is printed whole, never cut. */
    char small[2048];
    char *msg = small;
    va_list ap;
    va_copy(ap, args);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof(small)) {
        char *big = malloc((size_t)n + 1);
        if (big != NULL) {
            va_copy(ap, args);
            vsnprintf(big, (size_t)n + 1, fmt, ap);
            va_end(ap);
            msg = big;
        }
    }
    pthread_mutex_lock(&mu);
    fprintf(stderr, "%s %-5s %s%s\n", when, names[l], prefix, n < 0 ? "" : msg);
    pthread_mutex_unlock(&mu);
    if (msg != small)
        free(msg);
}

void kgpu_log(kgpu_log_level l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kgpu_vlog(l, fmt, ap);
    va_end(ap);
}
