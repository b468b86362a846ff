/*
 * Fuzz target for the device plugin's fake GPU inventory file. Whatever it
 * accepts must be publishable: the kgpu.io/gpus annotation made from it must
 * parse back (as the extender parses it) to the same GPUs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "kgpu/model.h"
#include "podspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kgpu_gpu_info *gpus;
    int n;
    kgpu_error err;
    if (kgpu_fake_gpus_parse((const char *)data, size, "fuzz.yaml", &gpus, &n, &err) != KGPU_OK) {
        if (gpus != NULL || err.msg[0] == '\0')
            abort(); /* a refusal returns nothing and says why */
        return 0;
    }
    kgpu_gpu_spec specs[KGPU_MAX_GPUS_PER_NODE];
    if (n > KGPU_MAX_GPUS_PER_NODE)
        abort();
    for (int i = 0; i < n; i++)
        specs[i] = (kgpu_gpu_spec){.index = gpus[i].index,
                                   .uuid = gpus[i].uuid,
                                   .model = gpus[i].model,
                                   .memory_mib = gpus[i].memory_mib,
                                   .numa = gpus[i].numa,
                                   .healthy = gpus[i].healthy};
    char *text = kgpu_gpus_annotation_format(specs, n);
    if (text == NULL)
        abort();
    static kgpu_node_store back;
    int m;
    if (kgpu_gpus_annotation_parse(text, &back, &m, &err) != KGPU_OK || m != n)
        abort();
    for (int i = 0; i < n; i++) {
        const kgpu_gpu_spec *b = &back.gpus[i];
        if (b->index != specs[i].index || strcmp(b->uuid, specs[i].uuid) != 0 ||
            strcmp(b->model, specs[i].model) != 0 || b->memory_mib != specs[i].memory_mib ||
            b->numa != specs[i].numa || b->healthy != specs[i].healthy)
            abort();
    }
    free(text);
    free(gpus);
    return 0;
}
