/*
 * Fuzz target for the reader of one list page (kgpu__k8s_page_parse): the API
 * server's answer is outside input, and its continue token goes back into the
 * next request's URL. Whatever the reader accepts must hold what the list
 * relies on; whatever it refuses must come with a reason. The Status readers
 * of a failed page run on the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k8s_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    char reason[64], msg[256];
    kgpu__k8s_status_reason(body, size, reason, sizeof(reason));
    kgpu__k8s_status_message(body, size, msg, sizeof(msg));

    kgpu__k8s_page pg;
    kgpu_error err;
    kgpu_error_clear(&err);
    int rc = kgpu__k8s_page_parse(body, size, &pg, &err);
    if (rc != 0) {
        if (rc != KGPU_EPARSE || err.code != rc || err.msg[0] == '\0' || pg.doc != NULL)
            abort(); /* a refusal without a reason, or a page left behind */
        return 0;
    }
    size_t rvlen = strlen(pg.rv);
    if (pg.doc == NULL || rvlen == 0 || rvlen >= KGPU_K8S_RV_MAX ||
        (pg.items != NULL && !json_is_array(pg.items)) || pg.remaining < -1)
        abort();
    if (pg.cont != NULL) {
        /* The token goes into a URL: it must escape into the room list.c gives it. */
        size_t n = strlen(pg.cont);
        char *esc = malloc(3 * n + 1);
        if (n == 0 || n > KGPU__K8S_CONTINUE_MAX || esc == NULL ||
            kgpu__k8s_escape(pg.cont, esc, 3 * n + 1) != 0 || strpbrk(esc, "&# \r\n") != NULL)
            abort();
        free(esc);
    }
    json_decref(pg.doc);
    return 0;
}
