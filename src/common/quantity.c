/*
 * Kubernetes resource quantities ("500m", "1.5", "4Gi", "1e3") read exactly:
 * the significant digits go into a small decimal digit array, a binary suffix
 * multiplies that array by 2^10k, and the decimal exponent only moves the
 * decimal point, so no value is ever rounded through floating point.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "podspec.h"

/*
 * Significant digits kept (leading and trailing zeros are not stored). A
 * quantity needs at most 19 integer digits to fit int64; the rest is
 * fraction, kept exactly so that rounding up is exact too. Far more than the
 * API server ever writes (it keeps nano precision).
 */
#define QTY_DIGITS   96
#define QTY_GROWTH   20         /* digits a multiplication by up to 2^60 can add */
#define QTY_EXP_CAP  1000000000 /* |exponent| beyond this saturates: far past int64 either way */
#define QTY_SHOWN    40         /* characters of a bad quantity quoted in a message */
#define INT64_DIGITS 19

typedef struct qty_num {
    uint8_t d[QTY_DIGITS + QTY_GROWTH]; /* most significant first, d[0] != 0 when n > 0 */
    int n;
    int64_t exp10; /* value = d × 10^exp10 */
} qty_num;

static int qty_error(kgpu_error *err, int code, const char *s, const char *why)
{
    size_t len = strlen(s);
    return kgpu_error_set(err, code, "quantity '%.*s%s' %s",
                          (int)(len > QTY_SHOWN ? QTY_SHOWN : len), s, len > QTY_SHOWN ? "..." : "",
                          why);
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Multiplies the digit array by m (2..1024). Room for the carry is guaranteed by QTY_GROWTH. */
static void qty_mul_small(qty_num *q, unsigned m)
{
    unsigned carry = 0;
    for (int i = q->n - 1; i >= 0; i--) {
        unsigned v = q->d[i] * m + carry;
        q->d[i] = (uint8_t)(v % 10);
        carry = v / 10;
    }
    while (carry > 0) {
        memmove(q->d + 1, q->d, (size_t)q->n);
        q->d[0] = (uint8_t)(carry % 10);
        carry /= 10;
        q->n++;
    }
}

/*
 * Parses s into q (digits and power of ten, binary suffix already applied)
 * plus a power-of-ten shift `extra10` the caller wants (3 for milli). Returns
 * 0 or a KGPU error.
 */
static int qty_parse(const char *s, int extra10, qty_num *q, kgpu_error *err)
{
    const char *p = s;
    bool negative = false;
    memset(q, 0, sizeof(*q));
    if (*p == '+' || *p == '-') {
        negative = *p == '-';
        p++;
    }
    /*
     * Counts are bounded by the input length, so the exponent arithmetic below
     * stays far inside int64 for any string that fits in memory.
     */
    int64_t digits = 0;
    int64_t zeros = 0; /* zeros after the last nonzero digit, not stored */
    int64_t frac = 0;  /* digits after the decimal point */
    bool point = false;
    for (;; p++) {
        if (*p == '.' && !point) {
            point = true;
            continue;
        }
        if (!is_digit(*p))
            break;
        digits++;
        frac += point;
        if (*p == '0') {
            zeros += q->n > 0;
            continue;
        }
        if (q->n + zeros + 1 > QTY_DIGITS)
            return qty_error(err, KGPU_ERANGE, s, "has too many significant digits");
        for (; zeros > 0; zeros--)
            q->d[q->n++] = 0;
        q->d[q->n++] = (uint8_t)(*p - '0');
    }
    if (digits == 0)
        return qty_error(err, KGPU_EPARSE, s, "is not a number");

    /* Suffix: binary SI, a decimal exponent, or decimal SI. */
    int shift2 = 0;
    int64_t sfx10 = 0;
    if ((p[0] == 'e' || p[0] == 'E') &&
        (is_digit(p[1]) || ((p[1] == '+' || p[1] == '-') && is_digit(p[2])))) {
        p++;
        bool eneg = *p == '-';
        if (*p == '+' || *p == '-')
            p++;
        int64_t e = 0;
        for (; is_digit(*p); p++)
            if (e < QTY_EXP_CAP)
                e = e * 10 + (*p - '0');
        sfx10 = eneg ? -e : e;
    } else if (p[0] != '\0' && p[1] == 'i' && p[2] == '\0') {
        static const char binary[] = "KMGTPE";
        const char *b = strchr(binary, p[0]);
        if (b == NULL)
            return qty_error(err, KGPU_EPARSE, s, "has an unknown suffix");
        shift2 = 10 * (int)(b - binary + 1);
        p += 2;
    } else if (p[0] != '\0' && p[1] == '\0') {
        switch (p[0]) {
        case 'm':
            sfx10 = -3;
            break;
        case 'k':
            sfx10 = 3;
            break;
        case 'M':
            sfx10 = 6;
            break;
        case 'G':
            sfx10 = 9;
            break;
        case 'T':
            sfx10 = 12;
            break;
        case 'P':
            sfx10 = 15;
            break;
        case 'E':
            sfx10 = 18;
            break;
        default:
            return qty_error(err, KGPU_EPARSE, s, "has an unknown suffix");
        }
        p++;
    }
    if (*p != '\0')
        return qty_error(err, KGPU_EPARSE, s, "is not a quantity");
    if (negative && q->n > 0)
        return qty_error(err, KGPU_ERANGE, s, "is negative");
    q->exp10 = zeros - frac + sfx10 + extra10;
    for (; shift2 > 0 && q->n > 0; shift2 -= 10)
        qty_mul_small(q, 1024);
    return 0;
}

/* ceil(q) as int64, or KGPU_ERANGE. */
static int qty_ceil(const qty_num *q, const char *s, int64_t *out, kgpu_error *err)
{
    if (q->n == 0) {
        *out = 0;
        return 0;
    }
    int64_t intdigits = q->n + q->exp10;
    if (intdigits > INT64_DIGITS)
        return qty_error(err, KGPU_ERANGE, s, "overflows a 64-bit integer");
    uint64_t v = 0;
    bool fraction = false;
    for (int64_t i = 0; i < intdigits; i++) {
        v = v * 10 + (i < q->n ? q->d[i] : 0); /* 19 digits fit in uint64 */
    }
    for (int64_t i = intdigits > 0 ? intdigits : 0; i < q->n; i++)
        fraction |= q->d[i] != 0;
    if (fraction)
        v++;
    if (v > (uint64_t)INT64_MAX)
        return qty_error(err, KGPU_ERANGE, s, "overflows a 64-bit integer");
    *out = (int64_t)v;
    return 0;
}

static int quantity(const char *s, int extra10, int64_t *out, kgpu_error *err)
{
    qty_num q;
    if (s == NULL)
        return kgpu_error_set(err, KGPU_EINVAL, "no quantity given");
    int rc = qty_parse(s, extra10, &q, err);
    if (rc != 0)
        return rc;
    return qty_ceil(&q, s, out, err);
}

int kgpu_quantity_milli(const char *s, int64_t *out, kgpu_error *err)
{
    return quantity(s, 3, out, err);
}

int kgpu_quantity_value(const char *s, int64_t *out, kgpu_error *err)
{
    return quantity(s, 0, out, err);
}
