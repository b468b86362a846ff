/*
 * Fuzz target for the trace reader: outside input of the worst kind (CSV from a
 * download). First byte 'n' selects the node list parser, anything else the pod list
 * parser; whatever parses must also build a cluster or make a request the core accepts.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "kgpu/model.h"
#include "kgpu/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    bool nodes = data[0] == 'n';
    const char *buf = (const char *)data + 1;
    size--;
    kgpu_trace t;
    kgpu_error err;
    int rc = nodes ? kgpu_trace_parse_nodes(buf, size, "fuzz.csv", &t, &err)
                   : kgpu_trace_parse_pods(buf, size, "fuzz.csv", &t, &err);
    if (rc == KGPU_ESTATE)
        abort(); /* the arena bound was wrong: a parser bug, whatever the input */
    if (rc != KGPU_OK)
        return 0;
    if (nodes) {
        kgpu_cluster *c = kgpu_cluster_new();
        if (c != NULL) {
            /* May fail (duplicate names, uuid too long): only crashes and leaks matter. */
            (void)kgpu_trace_build_cluster(&t, c, &err);
            kgpu_cluster_free(c);
        }
    } else {
        /* The parser's checks promise a valid request: anything else is a bug. */
        for (size_t i = 0; i < t.npods; i++) {
            kgpu_request req;
            kgpu_trace_pod_request(&t.pods[i], &req);
            if (kgpu_request_validate(&req, &err) != KGPU_OK)
                abort();
        }
    }
    kgpu_trace_free(&t);
    return 0;
}
