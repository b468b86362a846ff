/*
 * Fuzz target for the --seeds parser of kgpu simulate ("42-51", "1,5,9-11"):
 * command-line text is outside input too. Whatever parses must respect the
 * bound on the number of seeds and be made of the digits it was given.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    uint64_t seeds[64];
    int n = -1;
    kgpu_error err;
    if (kgpu_parse_seeds(text, seeds, 64, &n, &err) == 0) {
        if (n < 1 || n > 64 || strlen(text) == 0)
            abort();
        if (strcmp(text, "18446744073709551615") == 0 && (n != 1 || seeds[0] != UINT64_MAX))
            abort(); /* the largest seed is one seed, not a wrap-around */
    } else if (strstr(err.msg, "--seeds") == NULL) {
        abort(); /* every error names the option */
    }
    free(text);
    return 0;
}
