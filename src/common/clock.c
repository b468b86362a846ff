#include "clock.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void format_ts(time_t sec, long nsec, int digits, char *buf, size_t len)
{
    struct tm tm;
    gmtime_r(&sec, &tm);
    char base[32];
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    if (digits <= 0) {
        snprintf(buf, len, "%sZ", base);
        return;
    }
    if (digits > 9)
        digits = 9;
    long frac = nsec;
    for (int i = digits; i < 9; i++)
        frac /= 10;
    snprintf(buf, len, "%s.%0*ldZ", base, digits, frac);
}

void kgpu_rfc3339_now(char *buf, size_t len)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    format_ts(ts.tv_sec, ts.tv_nsec, 9, buf, len);
}

void kgpu_rfc3339(double t, int digits, char *buf, size_t len)
{
    time_t sec = (time_t)t;
    long nsec = (long)((t - (double)sec) * 1e9);
    if (nsec < 0)
        nsec = 0;
    if (nsec > 999999999)
        nsec = 999999999;
    format_ts(sec, nsec, digits, buf, len);
}

bool kgpu_rfc3339_parse(const char *s, double *out)
{
    if (s == NULL)
        return false;
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    int n = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &n) != 6 ||
        n == 0)
        return false;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    const char *p = s + n;
    double frac = 0, scale = 0.1;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, scale /= 10)
            frac += (*p - '0') * scale;
    }
    long offset = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int hh, mm, m = 0;
        if (sscanf(p + 1, "%2d:%2d%n", &hh, &mm, &m) != 2 || m != 5)
            return false;
        offset = (*p == '-' ? -1 : 1) * (hh * 3600L + mm * 60L);
        p += 6;
    } else {
        return false;
    }
    if (*p != '\0')
        return false;
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return false;
    *out = (double)(t - offset) + frac;
    return true;
}
