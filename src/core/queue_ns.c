/*
 * Which namespaces a queue admits (core.h, kgpu_queue_spec.namespaces and
 * .selector): the list and the label selector of each queue, copied and
 * checked when a tree is made, then only read. A tree's clones share one
 * copy, counted, so cloning a tree for every recharge copies no strings.
 *
 * A selector reads as Kubernetes reads a namespaceSelector: every
 * requirement must hold; an empty selector selects every namespace. The
 * label kubernetes.io/metadata.name, which the API server sets on every
 * namespace to its name, reads as the name when the caller did not pass it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define META_NAME "kubernetes.io/metadata.name"

typedef struct qsel {
    char *key;
    kgpu_qsel_op op;
    char **values;
    int nvalues;
} qsel;

typedef struct qrule {
    char **namespaces;
    int nnamespaces;
    bool has_selector;
    qsel *sel;
    int nsel;
} qrule;

struct kgpu__qns {
    int refs; /* holders: trees sharing it; changed atomically */
    int n;
    qrule *r; /* by queue id */
};

bool kgpu_namespace_name_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return false;
    return true;
}

/* A label value: at most 63 of [A-Za-z0-9._-] (empty allowed), as Kubernetes allows. */
static bool label_value(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (s == NULL || n > 63)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* A label key: 1..317 of [A-Za-z0-9._/-]; the form is the API server's to check. */
static bool label_key(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > KGPU_QUEUE_LABEL_KEY_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '/'))
            return false;
    }
    return true;
}

static void rule_free(qrule *r)
{
    for (int i = 0; i < r->nnamespaces; i++)
        free(r->namespaces[i]);
    free(r->namespaces);
    for (int i = 0; i < r->nsel; i++) {
        for (int v = 0; v < r->sel[i].nvalues; v++)
            free(r->sel[i].values[v]);
        free(r->sel[i].values);
        free(r->sel[i].key);
    }
    free(r->sel);
}

void kgpu__qns_free(kgpu__qns *r)
{
    if (r == NULL || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    for (int i = 0; i < r->n; i++)
        rule_free(&r->r[i]);
    free(r->r);
    free(r);
}

kgpu__qns *kgpu__qns_ref(kgpu__qns *r)
{
    if (r != NULL)
        __atomic_add_fetch(&r->refs, 1, __ATOMIC_ACQ_REL);
    return r;
}

/* Copies and checks one queue's selector. */
static int copy_selector(const kgpu_queue_spec *s, qrule *r, kgpu_error *err)
{
    if (s->nselector < 0 || s->nselector > KGPU_QUEUE_MAX_SELECTOR ||
        (s->nselector > 0 && s->selector == NULL))
        return kgpu_error_set(err, KGPU_EINVAL,
                              "queue %s: namespaceSelector: at most %d requirements", s->name,
                              KGPU_QUEUE_MAX_SELECTOR);
    r->has_selector = true;
    if (s->nselector == 0)
        return 0;
    if ((r->sel = calloc((size_t)s->nselector, sizeof(*r->sel))) == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (int i = 0; i < s->nselector; i++) {
        const kgpu_queue_selreq *q = &s->selector[i];
        qsel *x = &r->sel[r->nsel++];
        bool valued = q->op == KGPU_QSEL_IN || q->op == KGPU_QSEL_NOT_IN;
        if (!label_key(q->key))
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "queue %s: namespaceSelector: key '%.80s': 1 to %d characters "
                                  "of A-Z, a-z, 0-9, '.', '_', '-' and '/'",
                                  s->name, q->key ? q->key : "", KGPU_QUEUE_LABEL_KEY_MAX);
        if (q->op < KGPU_QSEL_IN || q->op > KGPU_QSEL_NOT_EXISTS)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "queue %s: namespaceSelector: key %s: unknown operator", s->name,
                                  q->key);
        if (valued ? (q->nvalues < 1 || q->nvalues > KGPU_QUEUE_MAX_SEL_VALUES || !q->values)
                   : q->nvalues != 0)
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "queue %s: namespaceSelector: key %s: %s", s->name, q->key,
                                  valued ? "In and NotIn take 1 to 64 values"
                                         : "Exists and DoesNotExist take no values");
        x->op = q->op;
        if ((x->key = strdup(q->key)) == NULL ||
            (valued && (x->values = calloc((size_t)q->nvalues, sizeof(char *))) == NULL))
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        for (int v = 0; v < q->nvalues; v++) {
            if (!label_value(q->values[v]))
                return kgpu_error_set(err, KGPU_EINVAL,
                                      "queue %s: namespaceSelector: key %s: value '%.80s': at "
                                      "most 63 characters of A-Z, a-z, 0-9, '.', '_' and '-'",
                                      s->name, q->key, q->values[v] ? q->values[v] : "");
            if ((x->values[x->nvalues++] = strdup(q->values[v])) == NULL)
                return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
        }
    }
    return 0;
}

static int copy_rule(const kgpu_queue_spec *s, qrule *r, kgpu_error *err)
{
    if (s->nnamespaces < 0 || s->nnamespaces > KGPU_QUEUE_MAX_NAMESPACES ||
        (s->nnamespaces > 0 && s->namespaces == NULL))
        return kgpu_error_set(err, KGPU_EINVAL, "queue %s: namespaces: at most %d", s->name,
                              KGPU_QUEUE_MAX_NAMESPACES);
    if (s->nnamespaces > 0 &&
        (r->namespaces = calloc((size_t)s->nnamespaces, sizeof(char *))) == NULL)
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    for (int i = 0; i < s->nnamespaces; i++) {
        if (!kgpu_namespace_name_valid(s->namespaces[i]))
            return kgpu_error_set(err, KGPU_EINVAL,
                                  "queue %s: namespaces[%d] '%.80s': a namespace name is 1 to 63 "
                                  "characters of a-z, 0-9 and '-'",
                                  s->name, i, s->namespaces[i] ? s->namespaces[i] : "");
        if ((r->namespaces[r->nnamespaces++] = strdup(s->namespaces[i])) == NULL)
            return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    return s->has_selector ? copy_selector(s, r, err) : 0;
}

int kgpu__qns_new(const kgpu_queue_spec *specs, int n, kgpu__qns **out, kgpu_error *err)
{
    *out = NULL;
    bool any = false;
    for (int i = 0; i < n; i++)
        any = any || specs[i].nnamespaces != 0 || specs[i].has_selector;
    if (!any)
        return 0;
    kgpu__qns *r = calloc(1, sizeof(*r));
    if (r == NULL || (r->r = calloc((size_t)n, sizeof(*r->r))) == NULL) {
        free(r);
        return kgpu_error_set(err, KGPU_ENOMEM, "out of memory");
    }
    r->refs = 1;
    r->n = n;
    for (int i = 0; i < n; i++) {
        int rc = copy_rule(&specs[i], &r->r[i], err);
        if (rc != 0) {
            kgpu__qns_free(r);
            return rc;
        }
    }
    *out = r;
    return 0;
}

/* The value of label `key` of ns, or NULL when unset. */
static const char *label_of(const kgpu_queue_ns *ns, const char *key)
{
    for (int i = 0; i < ns->nlabels; i++)
        if (ns->labels[i].key != NULL && strcmp(ns->labels[i].key, key) == 0)
            return ns->labels[i].value;
    return strcmp(key, META_NAME) == 0 ? ns->name : NULL;
}

static bool holds(const qsel *x, const kgpu_queue_ns *ns)
{
    const char *v = label_of(ns, x->key);
    bool in = false;
    for (int i = 0; v != NULL && i < x->nvalues && !in; i++)
        in = strcmp(x->values[i], v) == 0;
    switch (x->op) {
    case KGPU_QSEL_IN:
        return in;
    case KGPU_QSEL_NOT_IN:
        return !in;
    case KGPU_QSEL_EXISTS:
        return v != NULL;
    default:
        return v == NULL;
    }
}

bool kgpu__qns_admits(const kgpu__qns *r, int q, const kgpu_queue_ns *ns)
{
    if (r == NULL || q < 0 || q >= r->n || ns == NULL || ns->name == NULL)
        return false;
    const qrule *x = &r->r[q];
    for (int i = 0; i < x->nnamespaces; i++)
        if (strcmp(x->namespaces[i], ns->name) == 0)
            return true;
    if (!x->has_selector)
        return false;
    for (int i = 0; i < x->nsel; i++)
        if (!holds(&x->sel[i], ns))
            return false;
    return true;
}
