/*
 * Fuzz target for the module images libkgpu-limit.so reads before the
 * driver loads them (src/shim/modimage.c): cubins, PTX text, fatbinaries
 * and their LZ4 and Zstandard entries. Whatever the bytes, the estimate
 * reads only within them (the copy is exactly `size` bytes, so the
 * sanitizers see any read past it) and is either none or a whole number
 * of pages no larger than the cap allows, for a device of unknown compute
 * capability and for one of 8.0 (which picks a fatbinary's cubins).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "modimage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char *copy = malloc(size ? size : 1);
    if (copy == NULL)
        return 0;
    memcpy(copy, data, size);
    static const unsigned sms[] = {0, 80};
    for (size_t i = 0; i < sizeof(sms) / sizeof(sms[0]); i++) {
        uint64_t bytes = 0;
        int r = kgpu_modimage_estimate(copy, size, sms[i], &bytes);
        if (r != 0 && r != 1)
            abort();
        if (r == 1 &&
            (bytes == 0 || bytes % KGPU_MODIMAGE_PAGE != 0 || bytes > KGPU_MODIMAGE_MAX))
            abort();
    }
    free(copy);
    return 0;
}
