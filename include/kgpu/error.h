/*
 * kgpu error codes and the error object every fallible call fills in.
 * Codes are negative and come from one X-macro list, which also generates
 * their names and messages (kgpu_err_name, kgpu_strerror).
 */
#ifndef KGPU_ERROR_H
#define KGPU_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KGPU_ERRNO_MAP(X)                                                                          \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EPARSE, -3, "malformed input")                                                               \
    X(ENOFIT, -4, "request does not fit")                                                          \
    X(ENOENT, -5, "not found")                                                                     \
    X(EIO, -6, "input/output error")                                                               \
    X(ERANGE, -7, "value out of range")                                                            \
    X(EEXIST, -8, "already exists")                                                                \
    X(ESTATE, -9, "inconsistent state")                                                          \
    X(EAMBIG, -10, "ambiguous")

enum {
    KGPU_OK = 0,
#define KGPU__ERR_ENUM(name, value, text) KGPU_##name = (value),
    KGPU_ERRNO_MAP(KGPU__ERR_ENUM)
#undef KGPU__ERR_ENUM
};

#define KGPU_ERROR_MSG_MAX 512

/*
 * Filled in where a failure happens. Callers own it (usually on the stack);
 * a NULL pointer is accepted everywhere and means "I don't care why".
 */
typedef struct kgpu_error {
    int code;
    char msg[KGPU_ERROR_MSG_MAX];
} kgpu_error;

/* Sets code and a printf-style message; returns code so callers can `return kgpu_error_set(...)`.
 */
int kgpu_error_set(kgpu_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears err to KGPU_OK and an empty message. */
void kgpu_error_clear(kgpu_error *err);

/* "EINVAL" etc.; "UNKNOWN" for codes not in the list. Static strings. */
const char *kgpu_err_name(int code);

/* Human text for a code; static string. */
const char *kgpu_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif
