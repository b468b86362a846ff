/*
 * The CEL selectors of DRA requests, as far as kgpu reads them to score
 * nodes: a small recursive-descent compiler and evaluator for the subset
 * people write to pick GPUs. kube-scheduler's real CEL is the authority on
 * which devices a claim gets; kgpu only scores, so an expression outside
 * the subset is refused here (never guessed) and its request is scored as
 * "any device of the class" (dra_score.c says so in its reason).
 *
 * The subset, over domain gpu.kgpu.io only:
 *   device.attributes["gpu.kgpu.io"].NAME  (or ["NAME"]), NAME one of the
 *     attributes kgpu-dra-plugin publishes and kgpu keeps (NAMES below);
 *   device.capacity["gpu.kgpu.io"].memory / .cores (quantities);
 *   device.attributes["gpu.kgpu.io"].?NAME.orValue(literal);
 *   device.driver; has(device.attributes[...].NAME) and its equal
 *   "NAME" in device.attributes["gpu.kgpu.io"];
 *   string, int, true/false literals, quantity("40Gi"), semver("8.0.0"),
 *   [literal, ...]; == != on like types; < <= > >= on ints and on strings;
 *   x in [..]; q.compareTo(q2) (an int), q.isGreaterThan(q2), q.isLessThan(q2)
 *   of two quantities or two versions (computeCapability);
 *   ! && || and parentheses.
 * Types are checked when compiling, as the API server's CEL checks them, so
 * evaluating fails only where CEL's would: an attribute the device has not.
 *
 * A tenant writes these: the expression is read only up to EXT_CEL_LEN_MAX
 * bytes, EXT_CEL_DEPTH_MAX levels and EXT_CEL_NODES_MAX nodes (fuzz_cel).
 * Pure: no state, no lock.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "podspec.h"

#define DOMAIN "gpu.kgpu.io"

/* The attributes and capacities a selector may read, and their types. */
static const struct {
    const char *name;
    bool cap;
    int type;
} NAMES[] = {
    {"productName", false, EXT_CEL_STR}, {"model", false, EXT_CEL_STR},
    {"uuid", false, EXT_CEL_STR},        {"index", false, EXT_CEL_INT},
    {"numaNode", false, EXT_CEL_INT},    {"memoryMiB", false, EXT_CEL_INT},
    {"mig", false, EXT_CEL_BOOL},        {"profile", false, EXT_CEL_STR},
    {"migStart", false, EXT_CEL_INT},    {"migSize", false, EXT_CEL_INT},
    {"computeCapability", false, EXT_CEL_VER}, {"parentIndex", false, EXT_CEL_INT},
    {"parentUUID", false, EXT_CEL_STR},        {"multiprocessors", false, EXT_CEL_INT},
    {"memory", true, EXT_CEL_QTY},       {"cores", true, EXT_CEL_QTY},
};
#define NNAMES ((int)(sizeof(NAMES) / sizeof(NAMES[0])))

#define TYPE_MAP 100 /* device.attributes["gpu.kgpu.io"] itself: only after in */

enum op {
    OP_MAP,    /* TYPE_MAP; a: whether capacities */
    OP_LIT,    /* v */
    OP_LIST,   /* items a .. a+b-1 of e->nodes, literals */
    OP_GET,    /* attribute or capacity NAMES[name]; with a: b, its value when absent */
    OP_HAS,    /* has(NAMES[name]) */
    OP_DRIVER, /* device.driver */
    OP_NOT,
    OP_AND,
    OP_OR,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_CMPTO, /* a.compareTo(b): -1, 0, 1 */
    OP_ISGT,
    OP_ISLT,
};

typedef struct cel_node {
    int op;
    int type; /* its value's, checked when compiling */
    int a, b; /* operands (node indices) */
    int name; /* OP_GET, OP_HAS: index into NAMES */
    ext_cel_value v;
} cel_node;

struct ext_cel {
    int n, root;
    cel_node nodes[EXT_CEL_NODES_MAX];
    char strings[EXT_CEL_LEN_MAX + 1]; /* the literals' text, each NUL-ended */
    size_t used;
};

typedef struct parser {
    const char *p;
    ext_cel *e;
    int depth;
    char *why;
    size_t len;
    bool failed;
} parser;

static int fail(parser *ps, const char *fmt, ...)
{
    if (!ps->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->why, ps->len, fmt, ap);
        va_end(ap);
        ps->failed = true;
    }
    return -1;
}

static void skip_ws(parser *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

/* Consumes token t when it comes next (a word only when not followed by more of one). */
static bool take(parser *ps, const char *t)
{
    skip_ws(ps);
    size_t n = strlen(t);
    if (strncmp(ps->p, t, n) != 0)
        return false;
    if (isalpha((unsigned char)t[0]) && (isalnum((unsigned char)ps->p[n]) || ps->p[n] == '_'))
        return false;
    ps->p += n;
    return true;
}

static int add(parser *ps, int op, int type, int a, int b)
{
    if (ps->failed)
        return -1;
    if (ps->e->n == EXT_CEL_NODES_MAX)
        return fail(ps, "more than %d terms", EXT_CEL_NODES_MAX);
    ps->e->nodes[ps->e->n] = (cel_node){.op = op, .type = type, .a = a, .b = b, .name = -1};
    return ps->e->n++;
}

/* An identifier into buf (at most len-1 bytes); false when none comes next. */
static bool ident(parser *ps, char *buf, size_t len)
{
    skip_ws(ps);
    size_t n = 0;
    if (!isalpha((unsigned char)*ps->p) && *ps->p != '_')
        return false;
    while (isalnum((unsigned char)ps->p[n]) || ps->p[n] == '_')
        n++;
    if (n >= len)
        return false;
    memcpy(buf, ps->p, n);
    buf[n] = '\0';
    ps->p += n;
    return true;
}

/* A string literal, kept in e->strings; NULL when none comes next or it is malformed. */
static const char *string_lit(parser *ps)
{
    skip_ws(ps);
    char q = *ps->p;
    if (q != '"' && q != '\'')
        return NULL;
    ext_cel *e = ps->e;
    char *out = e->strings + e->used;
    size_t n = 0;
    for (const char *s = ps->p + 1;; s++) {
        if (*s == '\0' || *s == '\n') {
            fail(ps, "a string that does not end");
            return NULL;
        }
        if (*s == q) {
            ps->p = s + 1;
            break;
        }
        char c = *s;
        if (c == '\\') {
            s++;
            if (*s != '\\' && *s != '"' && *s != '\'') {
                fail(ps, "an escape other than \\\\, \\\" or \\'");
                return NULL;
            }
            c = *s;
        }
        if (e->used + n + 1 >= sizeof(e->strings)) {
            fail(ps, "too much string text");
            return NULL;
        }
        out[n++] = c;
    }
    out[n] = '\0';
    e->used += n + 1;
    return out;
}

/* A literal: string, int, true/false or quantity("..."); -1 when none (nothing consumed). */
static int literal(parser *ps)
{
    skip_ws(ps);
    const char *start = ps->p;
    const char *s = string_lit(ps);
    if (s != NULL) {
        int i = add(ps, OP_LIT, EXT_CEL_STR, -1, -1);
        if (i >= 0)
            ps->e->nodes[i].v = (ext_cel_value){.type = EXT_CEL_STR, .s = s};
        return i;
    }
    if (ps->failed)
        return -1;
    if (isdigit((unsigned char)*ps->p) || (*ps->p == '-' && isdigit((unsigned char)ps->p[1]))) {
        char *end;
        errno = 0;
        long long v = strtoll(ps->p, &end, 10);
        if (errno != 0 || isalpha((unsigned char)*end) || *end == '.')
            return fail(ps, "a number that is not an int in range");
        ps->p = end;
        int i = add(ps, OP_LIT, EXT_CEL_INT, -1, -1);
        if (i >= 0)
            ps->e->nodes[i].v = (ext_cel_value){.type = EXT_CEL_INT, .i = v};
        return i;
    }
    bool t = take(ps, "true");
    if (t || take(ps, "false")) {
        int i = add(ps, OP_LIT, EXT_CEL_BOOL, -1, -1);
        if (i >= 0)
            ps->e->nodes[i].v = (ext_cel_value){.type = EXT_CEL_BOOL, .b = t};
        return i;
    }
    if (take(ps, "semver")) {
        unsigned maj, min, patch;
        int used = 0;
        const char *vs;
        if (!take(ps, "(") || (vs = string_lit(ps)) == NULL ||
            sscanf(vs, "%4u.%4u.%4u%n", &maj, &min, &patch, &used) != 3 || vs[used] != '\0' ||
            maj > 1023 || min > 1023 || patch > 1023 || !take(ps, ")"))
            return fail(ps, "semver() of no version MAJOR.MINOR.PATCH kgpu reads");
        int i = add(ps, OP_LIT, EXT_CEL_VER, -1, -1);
        if (i >= 0)
            ps->e->nodes[i].v =
                (ext_cel_value){.type = EXT_CEL_VER, .i = EXT_CEL_SEMVER(maj, min, patch)};
        return i;
    }
    if (take(ps, "quantity")) {
        int64_t q = 0;
        if (!take(ps, "("))
            return fail(ps, "quantity without (");
        const char *qs = string_lit(ps);
        if (qs == NULL || kgpu_quantity_value(qs, &q, NULL) != 0)
            return fail(ps, "quantity() of no quantity");
        if (!take(ps, ")"))
            return fail(ps, "quantity(...) without )");
        int i = add(ps, OP_LIT, EXT_CEL_QTY, -1, -1);
        if (i >= 0)
            ps->e->nodes[i].v = (ext_cel_value){.type = EXT_CEL_QTY, .i = q};
        return i;
    }
    ps->p = start;
    return -1;
}

/* NAMES' index of `name` (a capacity when cap), or -1. */
static int name_index(bool cap, const char *name)
{
    for (int k = 0; k < NNAMES; k++)
        if (NAMES[k].cap == cap && strcmp(NAMES[k].name, name) == 0)
            return k;
    return -1;
}

/* After "device": .driver, or .attributes/.capacity["gpu.kgpu.io"].NAME; `has`: for has(). */
static int device_ref(parser *ps, bool has)
{
    char word[32];
    if (!take(ps, ".") || !ident(ps, word, sizeof(word)))
        return fail(ps, "device without .driver, .attributes or .capacity");
    if (strcmp(word, "driver") == 0 && !has)
        return add(ps, OP_DRIVER, EXT_CEL_STR, -1, -1);
    bool cap = strcmp(word, "capacity") == 0;
    if (!cap && strcmp(word, "attributes") != 0)
        return fail(ps, "device.%s is not read by kgpu", word);
    const char *dom;
    if (!take(ps, "[") || (dom = string_lit(ps)) == NULL || !take(ps, "]"))
        return fail(ps, "device.%s without [\"domain\"]", word);
    if (strcmp(dom, DOMAIN) != 0)
        return fail(ps, "domain %.60s is not " DOMAIN, dom);
    char name[32];
    const char *q = NULL;
    if (!has && take(ps, ".?")) {
        /* .?NAME.orValue(literal): the attribute, or the literal where the device has none. */
        int k = ident(ps, name, sizeof(name)) ? name_index(cap, name) : -1;
        if (k < 0)
            return fail(ps, "an optional %s kgpu does not read", cap ? "capacity" : "attribute");
        if (!take(ps, ".") || !take(ps, "orValue") || !take(ps, "("))
            return fail(ps, ".?%s without .orValue(...)", name);
        int dflt = literal(ps);
        if (dflt < 0 || !take(ps, ")"))
            return fail(ps, "orValue( of no literal or without )");
        if (ps->e->nodes[dflt].type != NAMES[k].type)
            return fail(ps, "orValue( of another type than %s's", name);
        int i = add(ps, OP_GET, NAMES[k].type, 1, dflt);
        if (i >= 0)
            ps->e->nodes[i].name = k;
        return i;
    }
    if (take(ps, ".")) {
        if (!ident(ps, name, sizeof(name)))
            return fail(ps, "a %s without a name", word);
    } else if (take(ps, "[") && (q = string_lit(ps)) != NULL && take(ps, "]")) {
        snprintf(name, sizeof(name), "%.31s", q);
    } else if (!has && !ps->failed) {
        return add(ps, OP_MAP, TYPE_MAP, cap, -1); /* "NAME" in device.attributes[...] */
    } else {
        return fail(ps, "a %s without a name", word);
    }
    int k = name_index(cap, name);
    if (k < 0)
        return fail(ps, "%s %.31s is not one kgpu reads", cap ? "capacity" : "attribute", name);
    int i = add(ps, has ? OP_HAS : OP_GET, has ? EXT_CEL_BOOL : NAMES[k].type, -1, -1);
    if (i >= 0)
        ps->e->nodes[i].name = k;
    return i;
}

static int parse_or(parser *ps);

/* [literal, ...]: items are the nodes right after the list's own. */
static int list_lit(parser *ps)
{
    int i = add(ps, OP_LIST, EXT_CEL_LIST, -1, 0);
    if (i < 0)
        return -1;
    int type = 0;
    if (take(ps, "]"))
        return i;
    do {
        int item = literal(ps);
        if (item < 0)
            return fail(ps, "a list item that is not a literal");
        if (type != 0 && ps->e->nodes[item].type != type)
            return fail(ps, "a list of mixed types");
        type = ps->e->nodes[item].type;
        ps->e->nodes[i].b++;
    } while (take(ps, ","));
    if (!take(ps, "]"))
        return fail(ps, "a list without ]");
    ps->e->nodes[i].a = i + 1;
    ps->e->nodes[i].v.type = type; /* the items' */
    return i;
}

static int primary(parser *ps)
{
    int i;
    if (take(ps, "(")) {
        if (++ps->depth > EXT_CEL_DEPTH_MAX)
            return fail(ps, "nested deeper than %d", EXT_CEL_DEPTH_MAX);
        i = parse_or(ps);
        ps->depth--;
        if (i >= 0 && !take(ps, ")"))
            return fail(ps, "( without )");
    } else if (take(ps, "[")) {
        i = list_lit(ps);
    } else if (take(ps, "has")) {
        if (!take(ps, "(") || !take(ps, "device"))
            return fail(ps, "has() of something else than a device attribute");
        i = device_ref(ps, true);
        if (i >= 0 && !take(ps, ")"))
            return fail(ps, "has( without )");
    } else if (take(ps, "device")) {
        i = device_ref(ps, false);
    } else if ((i = literal(ps)) < 0) {
        skip_ws(ps);
        return fail(ps, *ps->p ? "cannot read at \"%.20s\"" : "an expression that ends early",
                    ps->p);
    }
    /* Methods of quantities. */
    while (i >= 0 && take(ps, ".")) {
        char m[32];
        if (!ident(ps, m, sizeof(m)) || !take(ps, "("))
            return fail(ps, "a method kgpu does not read");
        int op = strcmp(m, "compareTo") == 0       ? OP_CMPTO
                 : strcmp(m, "isGreaterThan") == 0 ? OP_ISGT
                 : strcmp(m, "isLessThan") == 0    ? OP_ISLT
                                                   : -1;
        if (op < 0)
            return fail(ps, "method %.31s is not read by kgpu", m);
        if (++ps->depth > EXT_CEL_DEPTH_MAX)
            return fail(ps, "nested deeper than %d", EXT_CEL_DEPTH_MAX);
        int arg = parse_or(ps);
        ps->depth--;
        if (arg < 0 || !take(ps, ")"))
            return fail(ps, "%s( without )", m);
        int t = ps->e->nodes[i].type;
        if ((t != EXT_CEL_QTY && t != EXT_CEL_VER) || ps->e->nodes[arg].type != t)
            return fail(ps, "%s of something else than two quantities or versions", m);
        i = add(ps, op, op == OP_CMPTO ? EXT_CEL_INT : EXT_CEL_BOOL, i, arg);
    }
    return i;
}

static int comparison(parser *ps)
{
    int l = primary(ps);
    if (l < 0)
        return -1;
    static const struct {
        const char *t;
        int op;
    } OPS[] = {{"==", OP_EQ}, {"!=", OP_NE}, {"<=", OP_LE}, {">=", OP_GE},
               {"<", OP_LT},  {">", OP_GT},  {"in", OP_IN}};
    for (size_t k = 0; k < sizeof(OPS) / sizeof(OPS[0]); k++) {
        if (!take(ps, OPS[k].t))
            continue;
        int r = primary(ps);
        if (r < 0)
            return -1;
        const cel_node *a = &ps->e->nodes[l], *b = &ps->e->nodes[r];
        int op = OPS[k].op;
        if (op == OP_IN && b->op == OP_MAP) {
            /* "NAME" in device.attributes["gpu.kgpu.io"]: has(...NAME). */
            int nm = a->op == OP_LIT && a->type == EXT_CEL_STR ? name_index(b->a, a->v.s) : -1;
            if (nm < 0)
                return fail(ps, "in of something else than a name kgpu reads in a map");
            cel_node *h = &ps->e->nodes[r];
            *h = (cel_node){.op = OP_HAS, .type = EXT_CEL_BOOL, .a = -1, .b = -1, .name = nm};
            return r;
        }
        if (a->type == TYPE_MAP || b->type == TYPE_MAP)
            return fail(ps, "a map compared");
        if (op == OP_IN) {
            if (b->type != EXT_CEL_LIST || (b->b > 0 && b->v.type != a->type))
                return fail(ps, "in of something else than a list of its type");
        } else if (a->type != b->type || a->type == EXT_CEL_LIST) {
            return fail(ps, "a comparison of unlike types");
        } else if (op != OP_EQ && op != OP_NE && a->type != EXT_CEL_INT &&
                   a->type != EXT_CEL_STR) {
            return fail(ps, "an ordering of something else than ints or strings");
        }
        return add(ps, op, EXT_CEL_BOOL, l, r);
    }
    return l;
}

static int unary(parser *ps)
{
    if (!take(ps, "!"))
        return comparison(ps);
    if (++ps->depth > EXT_CEL_DEPTH_MAX)
        return fail(ps, "nested deeper than %d", EXT_CEL_DEPTH_MAX);
    int a = unary(ps);
    ps->depth--;
    if (a >= 0 && ps->e->nodes[a].type != EXT_CEL_BOOL)
        return fail(ps, "! of something else than a bool");
    return a < 0 ? -1 : add(ps, OP_NOT, EXT_CEL_BOOL, a, -1);
}

/* One of && (op OP_AND) or || over `sub`s. */
static int chain(parser *ps, const char *t, int op, int (*sub)(parser *))
{
    int l = sub(ps);
    while (l >= 0 && take(ps, t)) {
        int r = sub(ps);
        if (r < 0)
            return -1;
        if (ps->e->nodes[l].type != EXT_CEL_BOOL || ps->e->nodes[r].type != EXT_CEL_BOOL)
            return fail(ps, "%s of something else than bools", t);
        l = add(ps, op, EXT_CEL_BOOL, l, r);
    }
    return l;
}

static int parse_and(parser *ps)
{
    return chain(ps, "&&", OP_AND, unary);
}

static int parse_or(parser *ps)
{
    return chain(ps, "||", OP_OR, parse_and);
}

ext_cel *ext_cel_compile(const char *expr, char *why, size_t len)
{
    if (strnlen(expr, EXT_CEL_LEN_MAX + 1) > EXT_CEL_LEN_MAX) {
        snprintf(why, len, "longer than %d bytes", EXT_CEL_LEN_MAX);
        return NULL;
    }
    ext_cel *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        snprintf(why, len, "out of memory");
        return NULL;
    }
    parser ps = {.p = expr, .e = e, .why = why, .len = len};
    e->root = parse_or(&ps);
    skip_ws(&ps);
    if (e->root >= 0 && *ps.p != '\0')
        fail(&ps, "cannot read at \"%.20s\"", ps.p);
    if (!ps.failed && e->root < 0)
        fail(&ps, "an empty expression");
    if (!ps.failed && e->nodes[e->root].type != EXT_CEL_BOOL)
        fail(&ps, "not a bool");
    if (ps.failed) {
        free(e);
        return NULL;
    }
    return e;
}

void ext_cel_free(ext_cel *e)
{
    free(e);
}

int ext_cel_terms(const ext_cel *e)
{
    return e->n;
}

/* ---- evaluation ---- */

/* Node i's value into *v: 0, or -1 where CEL fails (the device has not the attribute). */
static int value(const ext_cel *e, int i, const ext_cel_device *d, ext_cel_value *v);

static int truth(const ext_cel *e, int i, const ext_cel_device *d)
{
    ext_cel_value v;
    return value(e, i, d, &v) != 0 ? -1 : v.b;
}

static int compare(const ext_cel_value *a, const ext_cel_value *b)
{
    if (a->type == EXT_CEL_STR)
        return strcmp(a->s, b->s) < 0 ? -1 : strcmp(a->s, b->s) > 0;
    if (a->type == EXT_CEL_BOOL)
        return (int)a->b - (int)b->b;
    return a->i < b->i ? -1 : a->i > b->i;
}

static int value(const ext_cel *e, int i, const ext_cel_device *d, ext_cel_value *v)
{
    const cel_node *nd = &e->nodes[i];
    ext_cel_value a, b;
    memset(v, 0, sizeof(*v));
    v->type = nd->type;
    switch (nd->op) {
    case OP_LIT:
        *v = nd->v;
        return 0;
    case OP_DRIVER:
        v->s = d->driver != NULL ? d->driver : "";
        return 0;
    case OP_GET:
    case OP_HAS: {
        bool got = d->get(d->ctx, NAMES[nd->name].cap, NAMES[nd->name].name, &a);
        got = got && a.type == NAMES[nd->name].type;
        if (nd->op == OP_HAS) {
            v->b = got;
            return 0;
        }
        if (!got && nd->a == 1) { /* .?NAME.orValue(...) */
            *v = e->nodes[nd->b].v;
            return 0;
        }
        *v = a;
        return got ? 0 : -1;
    }
    case OP_NOT: {
        int t = truth(e, nd->a, d);
        v->b = t == 0;
        return t < 0 ? -1 : 0;
    }
    case OP_AND:
    case OP_OR: {
        /* CEL's: an error on one side is forgiven when the other side decides. */
        int l = truth(e, nd->a, d), r = truth(e, nd->b, d);
        int decide = nd->op == OP_AND ? 0 : 1;
        if (l == decide || r == decide) {
            v->b = decide;
            return 0;
        }
        v->b = !decide;
        return l < 0 || r < 0 ? -1 : 0;
    }
    case OP_IN: {
        if (value(e, nd->a, d, &a) != 0)
            return -1;
        const cel_node *list = &e->nodes[nd->b];
        for (int k = 0; k < list->b; k++)
            v->b = v->b || compare(&a, &e->nodes[list->a + k].v) == 0;
        return 0;
    }
    case OP_LIST:
    case OP_MAP:
        return -1; /* only under in */
    default:
        break;
    }
    if (value(e, nd->a, d, &a) != 0 || value(e, nd->b, d, &b) != 0)
        return -1;
    int c = compare(&a, &b);
    switch (nd->op) {
    case OP_EQ:
        v->b = c == 0;
        break;
    case OP_NE:
        v->b = c != 0;
        break;
    case OP_LT:
    case OP_ISLT:
        v->b = c < 0;
        break;
    case OP_LE:
        v->b = c <= 0;
        break;
    case OP_GT:
    case OP_ISGT:
        v->b = c > 0;
        break;
    case OP_GE:
        v->b = c >= 0;
        break;
    case OP_CMPTO:
        v->i = c;
        break;
    default:
        return -1;
    }
    return 0;
}

int ext_cel_eval(const ext_cel *e, const ext_cel_device *d)
{
    return truth(e, e->root, d);
}
