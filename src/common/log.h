/*
 * One line per call on stderr, for every kgpu program: "<time> <level> <text>",
 * the time in RFC 3339 UTC. The program sets the level (and, if it likes, the
 * time's precision and a prefix) once at start; any thread may then log.
 */
#ifndef KGPU_LOG_H
#define KGPU_LOG_H

#include <stdarg.h>

/* Ordered: a message is printed when its level is at least the program's. */
typedef enum kgpu_log_level {
    KGPU_LOG_DEBUG,
    KGPU_LOG_INFO,
    KGPU_LOG_WARN,
    KGPU_LOG_ERROR,
} kgpu_log_level;

/* The least level printed (default KGPU_LOG_INFO). Any thread, any time. */
void kgpu_log_set_level(kgpu_log_level level);
kgpu_log_level kgpu_log_get_level(void);

/* "debug", "info", "warn" or "error" -> *out (0); -1 for anything else. */
int kgpu_log_level_parse(const char *name, kgpu_log_level *out);

/*
 * How lines look, set at start before any other thread logs: the time's
 * fraction digits (0..9, default 9) and a prefix written after the level
 * (copied; default "", at most 63 characters).
 */
void kgpu_log_set_format(int time_digits, const char *prefix);

/*
 * Prints one line: the time, the level's name padded to 5 characters, the
 * prefix and the text. Thread-safe: a line is written whole, never
 * interleaved with another thread's.
 */
void kgpu_log(kgpu_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same with the arguments in a va_list (for a program's own wrapper). */
void kgpu_vlog(kgpu_log_level level, const char *fmt, va_list args)
    __attribute__((format(printf, 2, 0)));

#endif
