/*
 * Module images read for their footprint (modimage.h). Every read of a
 * binary image goes through in(), which checks it against the extent;
 * PTX is read token by token within its text; sizes are summed with
 * overflow checks and saturate at KGPU_MODIMAGE_MAX.
 *
 * Why the PTX bound holds. The driver compiles PTX into a cubin and loads
 * that, so a PTX module takes what the cubin's allocated sections take:
 * its variables (.global and .const, read from their declarations here),
 * each kernel's constant bank 0 (the driver's part, under
 * KGPU_MODIMAGE_PTX_FN, then the parameters as declared) and the code.
 * The JIT makes code only from the instruction statements in function
 * bodies. A SASS instruction is 16 bytes (8 plus a share of a control word
 * before Volta); nearly every PTX instruction becomes one or two, and
 * those ptxas expands into sequences (IEEE division, square root and
 * reciprocal, 64-bit integer division) take of the order of ten inline,
 * their slow paths being subroutines emitted once (from what ptxas is
 * known to emit; not yet checked on a GPU here). The shortest statement
 * (`ret;`) is 4 bytes and an expanding one, even with one-letter names,
 * about 17 (`div.rn.f64 a,b,c;`). So one instruction per byte of body
 * text (KGPU_MODIMAGE_PTX_CODE = 16) bounds all of these; compiler-written
 * PTX, at some 25 bytes per instruction line besides .loc lines and
 * comments, makes well under a byte of code per byte of text. The text
 * cannot bound what ptxas replicates: unrolled loops and a .func inlined
 * at many call sites. The caller settles every load to what the driver's
 * free memory dropped by, so such a module is caught after the load.
 * Shared and local memory are not device memory of the module (on-chip,
 * and charged at launch).
 */
#include <stdlib.h>
#include <string.h>

#include "modimage.h"

#ifdef KGPU_MODIMAGE_DECODE
#include <lz4.h>
#include <zstd.h>
#endif

#define SHF_ALLOC_   0x2u
#define ELF_EHDR     64u
#define ELF_SHDR     64u
#define FATBIN_HDR   16u
#define FATBIN_ENTRY 16u /* kind, version, header size, payload size: what is read of every one */
#define FATBIN_ARCH  32u /* ... and its architecture, where the header has it */
#define FATBIN_FULL  64u /* ... and the compressed and uncompressed sizes, and the flags */

/* The extent [off, off + n) lies within len and below the cap. */
static int in(size_t len, uint64_t off, uint64_t n)
{
    uint64_t cap = len < KGPU_MODIMAGE_MAX ? (uint64_t)len : KGPU_MODIMAGE_MAX;
    return off <= cap && n <= cap - off;
}

static uint64_t le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* a + b and a * b, saturating at the cap: a footprint past it is charged the cap first. */
static uint64_t add(uint64_t a, uint64_t b)
{
    return a >= KGPU_MODIMAGE_MAX || b >= KGPU_MODIMAGE_MAX - a ? KGPU_MODIMAGE_MAX : a + b;
}

static uint64_t mul(uint64_t a, uint64_t b)
{
    if (a == 0 || b == 0)
        return 0;
    return a >= KGPU_MODIMAGE_MAX || b >= KGPU_MODIMAGE_MAX / a ? KGPU_MODIMAGE_MAX : a * b;
}

/* total advanced to a multiple of align (a power of two at most a page). */
static uint64_t align_up(uint64_t total, uint64_t align)
{
    return align > 1 ? add(total, (align - total % align) % align) : total;
}

/* A sum rounded up to whole pages, at least one: a module takes a page, however small. */
static uint64_t pages(uint64_t total)
{
    total = (total + KGPU_MODIMAGE_PAGE - 1) / KGPU_MODIMAGE_PAGE * KGPU_MODIMAGE_PAGE;
    return total == 0 ? KGPU_MODIMAGE_PAGE : total;
}

static int elf_estimate(const unsigned char *p, size_t len, uint64_t *bytes)
{
    if (!in(len, 0, ELF_EHDR) || memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2 /* 64-bit */ ||
        p[5] != 1 /* little-endian */ || le(p + 18, 2) != KGPU_MODIMAGE_EM_CUDA)
        return 0;
    uint64_t shoff = le(p + 40, 8), shentsize = le(p + 58, 2), shnum = le(p + 60, 2);
    if (shnum == 0 || shentsize != ELF_SHDR || !in(len, shoff, shnum * ELF_SHDR))
        return 0; /* no sections, or extended numbering: not read */
    uint64_t total = 0;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *s = p + shoff + i * ELF_SHDR;
        uint64_t type = le(s + 4, 4), flags = le(s + 8, 8), off = le(s + 24, 8),
                 size = le(s + 32, 8), align = le(s + 48, 8);
        if (!(flags & SHF_ALLOC_))
            continue;
        if (type != 8 /* SHT_NOBITS */ && !in(len, off, size))
            return 0; /* contents past the image */
        if (align > 1 && (align & (align - 1)) == 0 && align <= KGPU_MODIMAGE_PAGE)
            total = align_up(total, align);
        total = add(total, size); /* NOBITS globals past the cap: the cap */
    }
    *bytes = pages(total);
    return 1;
}

/* ---- PTX ---- */

enum { T_END, T_WORD, T_STR, T_PUNCT, T_BAD };

typedef struct ptx {
    const unsigned char *p;
    size_t n, at; /* the text is p[0, n); the next token starts at or after at */
} ptx;

typedef struct tok {
    int kind;
    size_t at, len;
} tok;

/* Names, directives, opcodes and numbers are runs of these (".ptr.global.align", "0x10"). */
static int word_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '$' || c == '%' || c == '.';
}

/* The next token; comments and white space are skipped, a string is one token. */
static tok next(ptx *s)
{
    const unsigned char *p = s->p;
    for (;;) {
        while (s->at < s->n && (p[s->at] == ' ' || (p[s->at] >= '\t' && p[s->at] <= '\r')))
            s->at++;
        if (s->at + 1 < s->n && p[s->at] == '/' && p[s->at + 1] == '/') {
            while (s->at < s->n && p[s->at] != '\n')
                s->at++;
        } else if (s->at + 1 < s->n && p[s->at] == '/' && p[s->at + 1] == '*') {
            size_t i = s->at + 2;
            while (i + 1 < s->n && !(p[i] == '*' && p[i + 1] == '/'))
                i++;
            if (i + 1 >= s->n)
                return (tok){.kind = T_BAD, .at = s->at};
            s->at = i + 2;
        } else {
            break;
        }
    }
    tok t = {.kind = T_PUNCT, .at = s->at, .len = 1};
    if (s->at >= s->n)
        return (tok){.kind = T_END, .at = s->at};
    if (p[s->at] == '"') {
        size_t i = s->at + 1;
        while (i < s->n && p[i] != '"')
            i += p[i] == '\\' ? 2 : 1;
        if (i >= s->n)
            return (tok){.kind = T_BAD, .at = s->at};
        t.kind = T_STR;
        t.len = i + 1 - s->at;
    } else if (word_char(p[s->at])) {
        size_t i = s->at;
        while (i < s->n && word_char(p[i]))
            i++;
        t.kind = T_WORD;
        t.len = i - s->at;
    }
    s->at += t.len;
    return t;
}

static int is(const ptx *s, tok t, const char *w)
{
    size_t n = strlen(w);
    return (t.kind == T_WORD || t.kind == T_PUNCT) && t.len == n && memcmp(s->p + t.at, w, n) == 0;
}

/* A name (not a directive, not a number). */
static int is_name(const ptx *s, tok t)
{
    if (t.kind != T_WORD)
        return 0;
    unsigned char c = s->p[t.at];
    return c != '.' && !(c >= '0' && c <= '9');
}

/* An integer literal (decimal, 0x hex, 0b binary, 0 octal, optional U), saturating at the cap. */
static int num(const ptx *s, tok t, uint64_t *v)
{
    const unsigned char *p = s->p + t.at;
    size_t n = t.len, i = 0;
    unsigned base = 10;
    if (t.kind != T_WORD || !(p[0] >= '0' && p[0] <= '9'))
        return 0;
    if (n > 0 && (p[n - 1] == 'U' || p[n - 1] == 'u'))
        n--;
    if (n > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
        base = 16, i = 2;
    else if (n > 2 && p[0] == '0' && (p[1] == 'b' || p[1] == 'B'))
        base = 2, i = 2;
    else if (n > 1 && p[0] == '0')
        base = 8, i = 1;
    if (i >= n)
        return 0;
    *v = 0;
    for (; i < n; i++) {
        unsigned d = p[i] >= '0' && p[i] <= '9'   ? (unsigned)(p[i] - '0')
                     : p[i] >= 'a' && p[i] <= 'f' ? (unsigned)(p[i] - 'a' + 10)
                     : p[i] >= 'A' && p[i] <= 'F' ? (unsigned)(p[i] - 'A' + 10)
                                                  : 99;
        if (d >= base)
            return 0;
        *v = add(mul(*v, base), d);
    }
    return 1;
}

/* Bytes of one element of a fundamental or opaque type; 0 for what is not a type. */
static uint64_t type_size(const ptx *s, tok t)
{
    static const struct {
        const char *name;
        unsigned bytes;
    } types[] = {
        {".b8", 1},      {".u8", 1},        {".s8", 1},        {".e4m3", 1},     {".e5m2", 1},
        {".pred", 1},    {".b16", 2},       {".u16", 2},       {".s16", 2},      {".f16", 2},
        {".bf16", 2},    {".e4m3x2", 2},    {".e5m2x2", 2},    {".b32", 4},      {".u32", 4},
        {".s32", 4},     {".f32", 4},       {".f16x2", 4},     {".bf16x2", 4},   {".tf32", 4},
        {".b64", 8},     {".u64", 8},       {".s64", 8},       {".f64", 8},      {".b128", 16},
        {".texref", 16}, {".samplerref", 16}, {".surfref", 16},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (is(s, t, types[i].name))
            return types[i].bytes;
    return 0;
}

/* A balanced group from after its opening `open` through its `close`; 0, or -1. */
static int skip_group(ptx *s, const char *open, const char *close)
{
    for (int depth = 1; depth > 0;) {
        tok t = next(s);
        if (t.kind == T_END || t.kind == T_BAD)
            return -1;
        depth += is(s, t, open) ? 1 : is(s, t, close) ? -1 : 0;
    }
    return 0;
}

/*
 * What comes before a variable's name, from its first token `t`:
 * .align, .attribute(...), a vector width and the type. Sets the element
 * size (vector included) and the alignment (at least the element's).
 */
static int type_prefix(ptx *s, tok t, uint64_t *elem, uint64_t *align)
{
    uint64_t vec = 1, a = 1;
    for (;; t = next(s)) {
        if (is(s, t, ".align")) {
            if (!num(s, next(s), &a) || a == 0 || (a & (a - 1)) != 0 || a > KGPU_MODIMAGE_PAGE)
                return -1;
        } else if (is(s, t, ".attribute")) {
            if (!is(s, next(s), "(") || skip_group(s, "(", ")") != 0)
                return -1;
        } else if (is(s, t, ".v2") || is(s, t, ".v4") || is(s, t, ".v8")) {
            vec = (uint64_t)(s->p[t.at + 2] - '0');
        } else if ((*elem = type_size(s, t)) != 0) {
            *elem *= vec;
            *align = a > *elem || (*elem & (*elem - 1)) != 0 ? a : *elem;
            return 0;
        } else {
            return -1;
        }
    }
}

/* Array dimensions from `*t`; leaves the token after them in *t. *unsized: the first is []. */
static int dims(ptx *s, tok *t, uint64_t *count, int *unsized)
{
    *count = 1;
    *unsized = 0;
    for (int d = 0; is(s, *t, "["); d++) {
        tok v = next(s);
        uint64_t n;
        if (is(s, v, "]") && d == 0) {
            *unsized = 1;
        } else if (num(s, v, &n) && is(s, next(s), "]")) {
            *count = mul(*count, n);
        } else {
            return -1;
        }
        *t = next(s);
    }
    return 0;
}

/*
 * An initializer from after its `=`: *elems is how many top-level
 * elements it has (1 for a scalar); leaves the token after it in *t.
 */
static int initializer(ptx *s, tok *t, uint64_t *elems)
{
    tok v = next(s);
    if (!is(s, v, "{")) { /* a scalar: a number, an address, generic(x)+4 */
        for (int paren = 0;; v = next(s)) {
            if (v.kind == T_END || v.kind == T_BAD || is(s, v, "{") || is(s, v, "}") ||
                (paren == 0 && is(s, v, ")")))
                return -1;
            if (paren == 0 && (is(s, v, ",") || is(s, v, ";")))
                break;
            paren += is(s, v, "(") ? 1 : is(s, v, ")") ? -1 : 0;
        }
        *elems = 1;
        *t = v;
        return 0;
    }
    uint64_t commas = 0;
    int any = 0;
    for (int depth = 1; depth > 0;) {
        v = next(s);
        if (v.kind == T_END || v.kind == T_BAD)
            return -1;
        if (is(s, v, "{") || is(s, v, "("))
            depth++;
        else if (is(s, v, "}") || is(s, v, ")"))
            depth--;
        if (depth == 1 && is(s, v, ","))
            commas++;
        else if (depth >= 1)
            any = 1;
    }
    *elems = any ? commas + 1 : 0;
    *t = next(s);
    return 0;
}

/*
 * A declaration of .global or .const variables, from after its state
 * space through its `;`: their storage is added to *total unless `ext`
 * (an .extern declaration names storage defined elsewhere).
 */
static int ptx_variables(ptx *s, int ext, uint64_t *total)
{
    uint64_t elem = 0, align = 1, bank;
    tok t = next(s);
    if (is(s, t, "[")) { /* an old constant bank number, .const[2] */
        if (!num(s, next(s), &bank) || !is(s, next(s), "]"))
            return -1;
        t = next(s);
    }
    if (type_prefix(s, t, &elem, &align) != 0)
        return -1;
    for (;;) {
        uint64_t count, elems;
        int unsized;
        if (!is_name(s, next(s)))
            return -1;
        t = next(s);
        if (dims(s, &t, &count, &unsized) != 0)
            return -1;
        if (is(s, t, "=")) {
            if (initializer(s, &t, &elems) != 0)
                return -1;
            if (unsized)
                count = mul(count, elems), unsized = 0;
        }
        if (unsized && !ext)
            return -1; /* storage of no size */
        if (!ext)
            *total = add(align_up(*total, align), mul(elem, count));
        if (is(s, t, ";"))
            return 0;
        if (!is(s, t, ","))
            return -1;
    }
}

/* An entry's parameter list, from after its `(` through `)`: their bytes are added to *total. */
static int ptx_params(ptx *s, uint64_t *total)
{
    tok t = next(s);
    if (is(s, t, ")"))
        return 0;
    for (;;) {
        uint64_t elem = 0, align = 1, count, a;
        int unsized;
        if (!is(s, t, ".param") || type_prefix(s, next(s), &elem, &align) != 0)
            return -1;
        /* A pointer's attributes: .ptr, its state space, .align N (one word or several). */
        for (t = next(s); t.kind == T_WORD && s->p[t.at] == '.'; t = next(s)) {
            if (t.len >= 6 && memcmp(s->p + t.at + t.len - 6, ".align", 6) == 0 &&
                !num(s, next(s), &a))
                return -1;
        }
        if (!is_name(s, t))
            return -1;
        t = next(s);
        if (dims(s, &t, &count, &unsized) != 0 || unsized)
            return -1;
        *total = add(align_up(*total, align), mul(elem, count));
        if (is(s, t, ")"))
            return 0;
        if (!is(s, t, ","))
            return -1;
        t = next(s);
    }
}

/*
 * Whether the text at p starts with .version after white space and
 * comments. Reads byte by byte, never past a NUL or the cap: an image of
 * another format is not read on in search of a NUL.
 */
static int ptx_starts(const unsigned char *p, size_t cap)
{
    static const char version[] = ".version";
    size_t i = 0;
    while (i < cap && p[i] != '\0') {
        if (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')) {
            i++;
        } else if (p[i] == '/' && i + 1 < cap && p[i + 1] == '/') {
            for (i += 2; i < cap && p[i] != '\0' && p[i] != '\n';)
                i++;
        } else if (p[i] == '/' && i + 1 < cap && p[i + 1] == '*') {
            for (i += 2; i + 1 < cap && p[i] != '\0' && !(p[i] == '*' && p[i + 1] == '/');)
                i++;
            if (i + 1 >= cap || p[i] == '\0')
                return 0;
            i += 2;
        } else {
            break;
        }
    }
    for (size_t k = 0; k < sizeof(version) - 1; k++)
        if (i + k >= cap || p[i + k] != (unsigned char)version[k])
            return 0;
    return 1;
}

/*
 * PTX text: p[0, len) up to its first NUL. A bare image (len SIZE_MAX) is
 * read to its NUL as the driver reads it, and not at all past the cap.
 */
static int ptx_estimate(const unsigned char *p, size_t len, uint64_t *bytes)
{
    size_t cap = len < KGPU_MODIMAGE_MAX ? len : (size_t)KGPU_MODIMAGE_MAX, n = 0;
    if (!ptx_starts(p, cap))
        return 0;
    while (n < cap && p[n] != '\0')
        n++;
    if (n == cap && cap < len)
        return 0;
    ptx s = {.p = p, .n = n, .at = 0};
    tok t = next(&s);
    if (!is(&s, t, ".version"))
        return 0;
    /*
     * Directives need not end in `;` (.version 8.0, .target, .file, .loc),
     * so declarations are found by their state space wherever it stands
     * alone: instructions carry theirs joined to the opcode (ld.global.u32),
     * and a kernel parameter's (.ptr.global) is read with its list.
     */
    enum { NONE, ENTRY, FUNC } fn = NONE;
    uint64_t vars = 0, fns = 0, code = 0;
    size_t body = 0;
    int depth = 0, ext = 0, params = 0, in_body = 0;
    for (;; t = next(&s)) {
        if (t.kind == T_BAD)
            return 0;
        if (t.kind == T_END)
            break;
        if (is(&s, t, ".visible") || is(&s, t, ".weak") || is(&s, t, ".common"))
            continue; /* linkage: .extern before or after them still holds */
        if (is(&s, t, "{")) {
            if (depth == 0 && fn != NONE) { /* a function's body */
                fns = add(fns, KGPU_MODIMAGE_PTX_FN);
                body = t.at, in_body = 1;
            }
            depth++;
            fn = NONE;
        } else if (is(&s, t, "}")) {
            if (depth == 0)
                return 0;
            if (--depth == 0 && in_body)
                code = add(code, t.at + 1 - body), in_body = 0;
        } else if (is(&s, t, ";")) {
            fn = NONE;
        } else if (params && is(&s, t, "(")) {
            if (ptx_params(&s, &fns) != 0)
                return 0;
        } else if (is(&s, t, ".extern")) {
            ext = 1, params = 0;
            continue;
        } else if (is(&s, t, ".global") || is(&s, t, ".const")) {
            if (ptx_variables(&s, ext, &vars) != 0)
                return 0;
        } else if (is(&s, t, ".entry")) {
            if (!is_name(&s, next(&s)))
                return 0;
            fn = ENTRY, ext = 0, params = 1;
            continue; /* its parameter list may follow */
        } else if (is(&s, t, ".func")) {
            fn = FUNC;
        }
        ext = 0, params = 0;
    }
    if (depth != 0)
        return 0;
    *bytes = pages(add(add(vars, fns), mul(code, KGPU_MODIMAGE_PTX_CODE)));
    return 1;
}

/* ---- compressed fatbinary entries ---- */

#ifdef KGPU_MODIMAGE_DECODE
/*
 * The payload `src` of `csize` bytes decompressed into a new buffer of at
 * most `usize` bytes (the size the entry states), which the caller frees;
 * NULL where it is damaged or states more than the cap or than the data
 * can hold. The buffer is allocated before anything is decoded, so its
 * size is checked first: an LZ4 block grows at most 255-fold, and a
 * Zstandard frame that states its content size must state this one.
 */
static unsigned char *decode(int zstd, const unsigned char *src, uint64_t csize, uint64_t usize,
                             size_t *got)
{
    if (csize == 0 || usize == 0 || usize > KGPU_MODIMAGE_MAX)
        return NULL;
    if (zstd) {
        unsigned long long stated = ZSTD_getFrameContentSize(src, (size_t)csize);
        if (stated == ZSTD_CONTENTSIZE_ERROR ||
            (stated != ZSTD_CONTENTSIZE_UNKNOWN && stated != usize))
            return NULL;
    } else if (usize > csize * 255 + 16) {
        return NULL;
    }
    unsigned char *buf = malloc((size_t)usize);
    if (buf == NULL)
        return NULL;
    if (zstd) {
        size_t r = ZSTD_decompress(buf, (size_t)usize, src, (size_t)csize);
        if (ZSTD_isError(r))
            r = 0;
        *got = r;
    } else {
        /* Partial decoding: what nvcc wrote need not end as liblz4's own blocks do. */
        int r = LZ4_decompress_safe_partial((const char *)src, (char *)buf, (int)csize, (int)usize,
                                            (int)usize);
        *got = r > 0 ? (size_t)r : 0;
    }
    if (*got == 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/*
 * Debian's libzstd is built with tracing hooks, weak references that the
 * dynamic linker would bind to whatever the tenant's program defines under
 * these names. Defined here, hidden, they resolve inside the library: no
 * tracing, and nothing of the tenant's is called.
 */
__attribute__((visibility("hidden"))) unsigned long long
ZSTD_trace_decompress_begin(const void *dctx);
__attribute__((visibility("hidden"))) void ZSTD_trace_decompress_end(unsigned long long ctx,
                                                                     const void *trace);
unsigned long long ZSTD_trace_decompress_begin(const void *dctx)
{
    (void)dctx;
    return 0;
}

void ZSTD_trace_decompress_end(unsigned long long ctx, const void *trace)
{
    (void)ctx;
    (void)trace;
}

int kgpu_modimage_decodes(void)
{
    return 1;
}
#else
static unsigned char *decode(int zstd, const unsigned char *src, uint64_t csize, uint64_t usize,
                             size_t *got)
{
    (void)zstd, (void)src, (void)csize, (void)usize, (void)got;
    return NULL;
}

int kgpu_modimage_decodes(void)
{
    return 0;
}
#endif

/* ---- fatbinaries ---- */

/* One entry of `ehsize` header bytes and `psize` payload bytes at e: its estimate, or 0. */
static int entry_estimate(const unsigned char *e, uint64_t ehsize, uint64_t psize, uint64_t *b)
{
    uint64_t kind = le(e, 2), flags = ehsize >= FATBIN_FULL ? le(e + 40, 8) : 0;
    const unsigned char *data = e + ehsize;
    size_t n = (size_t)psize;
    unsigned char *buf = NULL;
    if (flags & (KGPU_MODIMAGE_FLAG_LZ4 | KGPU_MODIMAGE_FLAG_ZSTD)) {
        uint64_t csize = le(e + 16, 4), usize = le(e + 56, 8);
        if (ehsize < FATBIN_FULL || csize > psize ||
            (buf = decode((flags & KGPU_MODIMAGE_FLAG_ZSTD) != 0, data, csize, usize, &n)) == NULL)
            return 0;
        data = buf;
    }
    int ok = kind == 2 ? elf_estimate(data, n, b) : kind == 1 ? ptx_estimate(data, n, b) : 0;
    free(buf);
    return ok;
}

/* A cubin entry the driver can load on a device of compute capability sm. */
static int loadable(const unsigned char *e, uint64_t ehsize, unsigned sm)
{
    uint64_t arch = ehsize >= FATBIN_ARCH ? le(e + 28, 4) : 0;
    return le(e, 2) == 2 && sm != 0 && arch != 0 && arch / 10 == sm / 10 && arch <= sm;
}

static int fatbin_estimate(const unsigned char *p, size_t len, unsigned sm, uint64_t *bytes)
{
    if (!in(len, 0, FATBIN_HDR) || le(p, 4) != KGPU_MODIMAGE_FATBIN)
        return 0;
    uint64_t hsize = le(p + 6, 2), fsize = le(p + 8, 8);
    if (hsize < FATBIN_HDR || !in(len, hsize, fsize))
        return 0;
    uint64_t end = hsize + fsize, best = 0;
    int found = 0, any_loadable = 0;
    /*
     * Pass 0 checks every entry and finds whether one is a cubin the driver
     * can load on this device (it then compiles no PTX); pass 1 estimates
     * the entries the driver may load.
     */
    for (int pass = 0; pass < 2; pass++) {
        uint64_t at = hsize;
        for (int n = 0; n < KGPU_MODIMAGE_ENTRIES && at < end; n++) {
            if (!in((size_t)end, at, FATBIN_ENTRY))
                return 0;
            const unsigned char *e = p + at;
            uint64_t ehsize = le(e + 4, 4), psize = le(e + 8, 8), b = 0;
            if (ehsize < FATBIN_ENTRY || !in((size_t)end, at, ehsize) ||
                !in((size_t)end, at + ehsize, psize))
                return 0;
            if (pass == 0) {
                any_loadable |= loadable(e, ehsize, sm);
            } else if ((!any_loadable || loadable(e, ehsize, sm)) &&
                       entry_estimate(e, ehsize, psize, &b)) {
                found = 1;
                best = b > best ? b : best;
            }
            at += ehsize + psize;
        }
    }
    if (!found)
        return 0;
    *bytes = best;
    return 1;
}

int kgpu_modimage_estimate(const void *image, size_t len, unsigned sm, uint64_t *bytes)
{
    const unsigned char *p = image;
    if (p == NULL || bytes == NULL || len < 4)
        return 0;
    if (memcmp(p, "\x7f" "ELF", 4) == 0)
        return elf_estimate(p, len, bytes);
    if (le(p, 4) == KGPU_MODIMAGE_FATBIN)
        return fatbin_estimate(p, len, sm, bytes);
    return ptx_estimate(p, len, bytes);
}
