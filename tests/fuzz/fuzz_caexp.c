/*
 * Fuzz target for kgpu-expander's reading of Cluster Autoscaler's
 * BestOptions requests (caexp_best_options): any bytes give either a
 * refusal that says why, or an answer that is a BestOptionsResponse naming
 * at most one option, one the request offered.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "caexp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const caexp_config cfg = {.memory_unit_mib = 1024, .pod_gpu_price = 1};
    uint8_t *out = NULL;
    size_t outlen = 0;
    caexp_decision d;
    kgpu_error err = {0};
    if (caexp_best_options(&cfg, data, size, &out, &outlen, &d, &err) != 0) {
        if (err.msg[0] == '\0' || out != NULL)
            abort(); /* a refusal says why, and answers nothing */
        return 0;
    }
    Kgpu__Caexp__BestOptionsResponse *r =
        kgpu__caexp__best_options_response__unpack(NULL, outlen, out);
    Kgpu__Caexp__BestOptionsRequest *q =
        kgpu__caexp__best_options_request__unpack(NULL, size, data);
    if (r == NULL || q == NULL || r->n_options > 1 || (r->n_options == 1) != (d.chosen >= 0))
        abort();
    if (r->n_options == 1) {
        if (d.chosen >= (int)q->n_options ||
            strcmp(r->options[0]->nodegroupid, q->options[d.chosen]->nodegroupid) != 0)
            abort();
    }
    kgpu__caexp__best_options_response__free_unpacked(r, NULL);
    kgpu__caexp__best_options_request__free_unpacked(q, NULL);
    free(out);
    return 0;
}
