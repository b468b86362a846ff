/*
 * A template node's price (caexp.h), from a prices file as kgpu simulate
 * --autoscale reads it (src/common/pricefile.c, kgpu_prices).
 */
#include <math.h>

#include "caexp.h"
#include "podspec.h"

double caexp_node_price(const kgpu_prices *p, const json_t *node, bool spot)
{
    kgpu_node_spec spec;
    kgpu_node_store store;
    kgpu_error err;
    if (p == NULL || kgpu_node_from_json(node, &spec, &store, &err) != 0)
        return -1;
    double total =
        (double)spec.cpu_milli / 1000.0 * (spot ? p->cpu_core.spot : p->cpu_core.on_demand);
    for (int g = 0; g < spec.ngpus; g++) {
        const kgpu_price *x = kgpu_prices_gpu(p, spec.gpus[g].model);
        if (x == NULL)
            return -1; /* a model without a price: the caller decides */
        total += spot ? x->spot : x->on_demand;
    }
    return isfinite(total) ? total : -1;
}
