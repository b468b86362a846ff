/*
 * The device plugin's one gRPC client call: Registration/Register of a
 * resource's socket with kubelet (device plugin API v1beta1).
 */
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "deviceplugin.pb-c.h"
#include "dp.h"

int dp_register(const char *kubelet_sock, const char *endpoint, const char *resource,
                bool preferred, unsigned timeout_ms, kgpu_error *err)
{
    V1beta1__DevicePluginOptions opts = V1BETA1__DEVICE_PLUGIN_OPTIONS__INIT;
    opts.pre_start_required = 0;
    opts.get_preferred_allocation_available = preferred;
    V1beta1__RegisterRequest req = V1BETA1__REGISTER_REQUEST__INIT;
    req.version = "v1beta1";
    req.endpoint = (char *)endpoint;
    req.resource_name = (char *)resource;
    req.options = &opts;
    uint8_t buf[2048];
    if (v1beta1__register_request__get_packed_size(&req) > sizeof(buf))
        return kgpu_error_set(err, KGPU_EINVAL, "register request too large");
    size_t len = v1beta1__register_request__pack(&req, buf);

    char target[1200];
    snprintf(target, sizeof(target), "unix:%s", kubelet_sock);
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, cr, NULL);
    grpc_channel_credentials_release(cr);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_slice method = grpc_slice_from_static_string("/v1beta1.Registration/Register");
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                               deadline, NULL);
    grpc_slice sl = grpc_slice_from_copied_buffer((const char *)buf, len);
    grpc_byte_buffer *out = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_byte_buffer *in = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = out;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &in;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    int rc = 0;
    static int done_tag;
    if (grpc_call_start_batch(call, ops, 6, &done_tag, NULL) != GRPC_CALL_OK) {
        rc = kgpu_error_set(err, KGPU_EIO, "Register with %s: cannot start the call", kubelet_sock);
    } else {
        grpc_event ev =
            grpc_completion_queue_pluck(cq, &done_tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
            rc = kgpu_error_set(err, KGPU_EIO, "Register with %s failed", kubelet_sock);
        } else if (status != GRPC_STATUS_OK) {
            char *d = grpc_slice_to_c_string(details);
            rc = kgpu_error_set(err, KGPU_EIO, "Register %s with %s: gRPC status %d: %s",
                                resource, kubelet_sock, (int)status, d);
            gpr_free(d);
        }
    }
    if (in != NULL)
        grpc_byte_buffer_destroy(in);
    grpc_byte_buffer_destroy(out);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    return rc;
}
