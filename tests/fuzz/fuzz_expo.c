/*
 * Fuzz target for the text exposition reader (src/common/expo.c) that `kgpu
 * report` reads /metrics with, from any server the operator names. Whatever
 * it accepts must be a sample it can hold: a metric name, labels within the
 * bounds, NUL-terminated; a refusal names the source and a line.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "expo.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int check(void *ctx, const kgpu_expo_sample *s, kgpu_error *err)
{
    (void)err;
    long *last = ctx;
    if (s->name[0] == '\0' || strlen(s->name) > KGPU_EXPO_NAME_MAX || s->line <= *last)
        abort();
    if (s->nlabels < 0 || s->nlabels > KGPU_EXPO_LABELS_MAX)
        abort();
    for (int i = 0; i < s->nlabels; i++)
        if (s->label[i].name[0] == '\0' || strlen(s->label[i].name) > KGPU_EXPO_NAME_MAX ||
            strlen(s->label[i].value) > KGPU_EXPO_VALUE_MAX ||
            kgpu_expo_label_value(s, s->label[i].name) != s->label[i].value)
            abort(); /* names are unique: the first of that name is this one */
    *last = s->line;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    long last = 0;
    kgpu_error err;
    if (kgpu_expo_parse((const char *)data, size, "fuzz.txt", check, &last, &err) != 0 &&
        strncmp(err.msg, "fuzz.txt:", 9) != 0)
        abort();
    return 0;
}
