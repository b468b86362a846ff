/*
 * Error object and the code tables generated from KGPU_ERRNO_MAP.
 * Libraries never print: they fill a kgpu_error for the caller to show.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kgpu/error.h"

int kgpu_error_set(kgpu_error *err, int code, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

void kgpu_error_clear(kgpu_error *err)
{
    if (err != NULL) {
        err->code = KGPU_OK;
        err->msg[0] = '\0';
    }
}

const char *kgpu_err_name(int code)
{
    switch (code) {
    case KGPU_OK:
        return "OK";
#define KGPU__ERR_NAME(name, value, text)                                                          \
    case KGPU_##name:                                                                              \
        return #name;
        KGPU_ERRNO_MAP(KGPU__ERR_NAME)
#undef KGPU__ERR_NAME
    default:
        return "UNKNOWN";
    }
}

const char *kgpu_strerror(int code)
{
    switch (code) {
    case KGPU_OK:
        return "success";
#define KGPU__ERR_TEXT(name, value, text)                                                          \
    case KGPU_##name:                                                                              \
        return text;
        KGPU_ERRNO_MAP(KGPU__ERR_TEXT)
#undef KGPU__ERR_TEXT
    default:
        return "unknown error";
    }
}
