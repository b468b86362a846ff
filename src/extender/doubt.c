/*
 * Binds in doubt. A Binding whose request went out but whose answer the bind
 * cannot act on (a timeout, a broken connection, a 5xx: kube-apiserver's
 * timeout filter answers 504 while the handler goes on) may still be applied.
 * Releasing its GPUs then would hand them to the next pod while the first
 * one's Binding lands on them: the same GPU twice. So they stay held, in
 * doubt, until the API server tells (the pod shows bound, bound otherwise,
 * or gone: pods.c), a bind of the pod to the same node takes them over
 * (bind.c), or --bind-doubt passes (ext_doubts_expire, pods.c, which
 * releases). Caller holds st->mu.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state_impl.h"

void ext_state_doubt(ext_state *st, ext_pod *p, double until)
{
    if (st->doubts == 0 || until < st->doubt_next)
        st->doubt_next = until; /* the earliest deadline, or earlier: never later */
    if (p->doubt_until <= 0)
        st->doubts++;
    p->doubt_until = until;
}

void ext_state_doubt_end(ext_state *st, ext_pod *p, enum ext_doubt_end how)
{
    if (p->doubt_until <= 0)
        return;
    p->doubt_until = 0;
    st->doubts--;
    if (how < EXT_DOUBT_RETRIED)
        atomic_fetch_add(&st->metrics->doubts_ended[how], 1);
}

ext_pod *ext_state_doubt_of(ext_state *st, const char *uid)
{
    if (st->doubts == 0)
        return NULL;
    ext_pod *p = kgpu_strmap_get(&st->pods, uid);
    return p != NULL && p->doubt_until > 0 ? p : NULL;
}

void ext_doubt_reason(const ext_state *st, const ext_pod *p, char *out, size_t len)
{
    double left = p->doubt_until - ext_now();
    snprintf(out, len,
             "an earlier Binding of this pod to %s got no answer, and the API server may still "
             "apply it: its GPUs are held on %s until the API server shows the pod, for at most "
             "%.0f s more (--bind-doubt %d)",
             p->node, p->node, left > 0 ? left : 0, st->cfg->bind_doubt_s);
}
