/*
 * Fuzz target for the DRA driver's checkpoint file (dra_ckpt_parse): a
 * refusal says why and leaves nothing; what it accepts encodes and parses
 * back to the same claims, its MIG placements lie within the GPU, and the
 * overlap check runs over it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dra.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dra_ckpt ck = {0}, back = {0};
    kgpu_error err = {0};
    if (dra_ckpt_parse((const char *)data, size, "ck", &ck, &err) != 0) {
        if (err.msg[0] == '\0' || ck.n != 0)
            abort();
        dra_ckpt_free(&ck);
        return 0;
    }
    char *text = dra_ckpt_encode(&ck);
    if (text == NULL || dra_ckpt_parse(text, strlen(text), "ck", &back, &err) != 0 ||
        back.n != ck.n)
        abort();
    for (int i = 0; i < ck.n; i++) {
        const dra_claim *a = &ck.claims[i], *b = &back.claims[i];
        if (strcmp(a->uid, b->uid) != 0 || strcmp(a->ns, b->ns) != 0 ||
            strcmp(a->name, b->name) != 0 || a->nallocs != b->nallocs || a->nreqs != b->nreqs ||
            memcmp(a->allocs, b->allocs, sizeof(a->allocs[0]) * (size_t)a->nallocs) != 0)
            abort();
        for (int r = 0; r < a->nreqs; r++)
            if (strcmp(a->reqs[r], b->reqs[r]) != 0)
                abort();
        for (int k = 0; k < a->nallocs; k++) {
            const dra_alloc *x = &a->allocs[k];
            if (x->profile[0] != '\0' && kgpu_mig_mask(x->mig_start, x->mig_size) == 0)
                abort();
        }
        /* A file on the node is input: the overlap check must hold up against it. */
        kgpu_error ce = {0};
        if (dra_ckpt_conflict(&ck, a, &ce) != 0 && ce.msg[0] == '\0')
            abort();
    }
    free(text);
    dra_ckpt_free(&ck);
    dra_ckpt_free(&back);
    return 0;
}
