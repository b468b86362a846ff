/*
 * Fuzz target for kgpu-expander's prices file (caexp_prices_from_json after
 * the YAML reader): whatever is accepted has at least one GPU model, every
 * price finite and within bounds, every model name non-empty and short; a
 * refusal says why.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "caexp.h"
#include "yamljson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool ok_price(const caexp_price *p)
{
    return isfinite(p->on_demand) && p->on_demand >= 0 && p->on_demand <= 1e6 &&
           (p->spot == -1 || (isfinite(p->spot) && p->spot >= 0 && p->spot <= 1e6));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kgpu_error err = {0};
    json_t *root = kgpu_yaml_load((const char *)data, size, "prices.yaml", &err);
    if (root == NULL) {
        if (err.msg[0] == '\0')
            abort();
        return 0;
    }
    static caexp_prices p;
    int rc = caexp_prices_from_json(root, "prices.yaml", &p, &err);
    json_decref(root);
    if (rc != 0) {
        if (err.msg[0] == '\0')
            abort();
        return 0;
    }
    if (p.n < 1 || p.n > CAEXP_MAX_PRICED || p.currency[0] == '\0' || !ok_price(&p.cpu_core))
        abort();
    for (int i = 0; i < p.n; i++)
        if (p.model[i][0] == '\0' || strlen(p.model[i]) >= KGPU_MODEL_NAME_MAX ||
            !ok_price(&p.gpu[i]))
            abort();
    return 0;
}
