/*
 * Fuzz target for the prices file reader (src/common/pricefile.c): an
 * operator's file, YAML or JSON. Whatever parses must hold prices the
 * simulator can use: finite, non-negative, named models, no more than
 * the table holds; a refusal leaves the table empty.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pricefile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(double x)
{
    if (!isfinite(x) || x < 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kgpu_prices p;
    kgpu_error err;
    if (kgpu_prices_load((const char *)data, size, "fuzz.yaml", &p, &err) != 0) {
        if (p.nmodels != 0 || strncmp(err.msg, "fuzz.yaml", 9) != 0)
            abort(); /* a refusal hands nothing back and names the file */
        return 0;
    }
    if (p.nmodels < 1 || p.nmodels > KGPU_MAX_MODELS || p.currency[0] == '\0')
        abort();
    check(p.cpu_core.on_demand);
    check(p.cpu_core.spot);
    for (int i = 0; i < p.nmodels; i++) {
        if (p.model[i][0] == '\0' || kgpu_prices_gpu(&p, p.model[i]) == NULL)
            abort();
        check(p.gpu[i].on_demand);
        check(p.gpu[i].spot);
    }
    return 0;
}
