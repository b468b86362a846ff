/*
 * Fuzz target for the CEL subset of DRA selectors (dra_cel.c): any text,
 * compiled, is either refused with a reason or evaluates on a whole GPU
 * and on a MIG device to true, false or a CEL failure, within its bounds.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ext.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool get(const void *ctx, bool cap, const char *name, ext_cel_value *out)
{
    bool mig = *(const bool *)ctx;
    memset(out, 0, sizeof(*out));
    if (cap) {
        *out = (ext_cel_value){.type = EXT_CEL_QTY, .i = (int64_t)40960 << 20};
        return strcmp(name, "memory") == 0;
    }
    if (strcmp(name, "productName") == 0 || (mig && strcmp(name, "profile") == 0))
        *out = (ext_cel_value){.type = EXT_CEL_STR, .s = mig ? "3g.20gb" : "A100-SXM4-40GB"};
    else if (strcmp(name, "index") == 0 || (mig && strcmp(name, "migStart") == 0))
        *out = (ext_cel_value){.type = EXT_CEL_INT, .i = 4};
    else if (mig && strcmp(name, "mig") == 0)
        *out = (ext_cel_value){.type = EXT_CEL_BOOL, .b = true};
    else
        return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char why[160] = "";
    ext_cel *e = ext_cel_compile(text, why, sizeof(why));
    if (e == NULL && why[0] == '\0')
        abort(); /* a refusal says why */
    if (e != NULL && strlen(text) > EXT_CEL_LEN_MAX)
        abort();
    for (int k = 0; e != NULL && k < 2; k++) {
        bool mig = k == 1;
        ext_cel_device d = {.driver = "gpu.kgpu.io", .get = get, .ctx = &mig};
        int v = ext_cel_eval(e, &d);
        if (v < -1 || v > 1)
            abort();
    }
    ext_cel_free(e);
    free(text);
    return 0;
}
