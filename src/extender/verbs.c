/*
 * One verb call from its body to its answer: NodeNames read on the fast
 * path where the verb takes candidates, the body parsed, the verb's
 * function called, the call counted with its latency.
 */
#include <stdlib.h>
#include <string.h>

#include "request.h"

void ext_decide(ext_ctx *d, enum ext_verb v, const char *body, size_t len, ext_response *r)
{
    memset(r, 0, sizeof(*r));
    double t0 = ext_now();
    atomic_fetch_add(&d->metrics->requests[v], 1);
    fast_names fast = {NULL, -1};
    char *copy = NULL, *store = NULL;
    if (v == VERB_FILTER || v == VERB_PRIORITIZE || v == VERB_PRIORITIZE_GPULESS) {
        copy = malloc(len + 1);
        store = malloc(len + 1);
        if (copy != NULL && store != NULL) {
            memcpy(copy, body, len);
            copy[len] = '\0';
            fast.n = ext_fast_node_names(copy, len, store, &fast.names);
        }
    }
    json_t *args = ext_parse_body(d, r, v, fast.n >= 0 ? copy : body, len);
    if (args != NULL) {
        switch (v) {
        case VERB_FILTER:
            ext_verb_filter(d, args, &fast, r);
            break;
        case VERB_PRIORITIZE:
        case VERB_PRIORITIZE_GPULESS:
            ext_verb_prioritize(d, args, &fast, r, v == VERB_PRIORITIZE_GPULESS);
            break;
        case VERB_BIND:
            ext_verb_bind(d, args, r);
            break;
        default:
            ext_verb_preempt(d, args, r);
            break;
        }
        json_decref(args);
    }
    free(fast.names);
    free(copy);
    free(store);
    if (r->body == NULL && r->status == 0)
        ext_reply_json(r, 500, json_pack("{s:s}", "Error", "out of memory"));
    ext_metrics_observe(d->metrics, v, ext_now() - t0);
}
