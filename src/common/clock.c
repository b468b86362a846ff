#include "clock.h"

#include <stdio.h>
#include <time.h>

void kgpu_rfc3339_now(char *buf, size_t len)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char base[32];
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, len, "%s.%09ldZ", base, ts.tv_nsec);
}
