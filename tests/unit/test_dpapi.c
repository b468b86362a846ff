/*
 * The device plugin API messages compiled from proto/deviceplugin.proto:
 * the bytes must be what kubelet's Go side writes and reads, so these tests
 * check exact encodings of small messages (field numbers and wire types
 * from the API) and round trips of the ones kgpu builds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "deviceplugin.pb-c.h"

static uint8_t *pack_device(const V1beta1__Device *d, size_t *len)
{
    *len = v1beta1__device__get_packed_size(d);
    uint8_t *buf = malloc(*len ? *len : 1);
    assert_non_null(buf);
    assert_int_equal(v1beta1__device__pack(d, buf), *len);
    return buf;
}

static void test_device_wire_bytes(void **state)
{
    V1beta1__NUMANode numa = V1BETA1__NUMANODE__INIT;
    numa.id = 1;
    V1beta1__NUMANode *nodes[] = {&numa};
    V1beta1__TopologyInfo topo = V1BETA1__TOPOLOGY_INFO__INIT;
    topo.n_nodes = 1;
    topo.nodes = nodes;
    V1beta1__Device d = V1BETA1__DEVICE__INIT;
    d.id = "g0";
    d.health = "Healthy";
    d.topology = &topo;
    size_t len;
    uint8_t *buf = pack_device(&d, &len);
    /* ID=1 "g0", health=2 "Healthy", topology=3 { nodes=1 { ID=1 varint 1 } } */
    static const uint8_t want[] = {0x0a, 2,   'g', '0',  0x12, 7,    'H', 'e',  'a', 'l',
                                   't',  'h', 'y', 0x1a, 4,    0x0a, 2,   0x08, 1};
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));
    free(buf);
}

static void test_register_request_bytes(void **state)
{
    V1beta1__DevicePluginOptions opt = V1BETA1__DEVICE_PLUGIN_OPTIONS__INIT;
    opt.get_preferred_allocation_available = 1;
    V1beta1__RegisterRequest r = V1BETA1__REGISTER_REQUEST__INIT;
    r.version = "v1beta1";
    r.endpoint = "k.sock";
    r.resource_name = "kgpu.io/gpu-mem";
    r.options = &opt;
    size_t len = v1beta1__register_request__get_packed_size(&r);
    uint8_t buf[64];
    assert_true(len <= sizeof(buf));
    v1beta1__register_request__pack(&r, buf);
    static const uint8_t want[] = {0x0a, 7,   'v', '1', 'b',  'e', 't',  'a',  '1', 0x12,
                                   6,    'k', '.', 's', 'o',  'c', 'k',  0x1a, 15,  'k',
                                   'g',  'p', 'u', '.', 'i',  'o', '/',  'g',  'p', 'u',
                                   '-',  'm', 'e', 'm', 0x22, 2,   0x10, 1};
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));
}

static void test_allocate_round_trip(void **state)
{
    /* What kubelet sends: one container asking for three memory units. */
    char *ids[] = {"GPU-a::0", "GPU-a::1", "GPU-a::2"};
    V1beta1__ContainerAllocateRequest creq = V1BETA1__CONTAINER_ALLOCATE_REQUEST__INIT;
    creq.n_devices_ids = 3;
    creq.devices_ids = ids;
    V1beta1__ContainerAllocateRequest *creqs[] = {&creq};
    V1beta1__AllocateRequest req = V1BETA1__ALLOCATE_REQUEST__INIT;
    req.n_container_requests = 1;
    req.container_requests = creqs;
    uint8_t buf[256];
    size_t len = v1beta1__allocate_request__pack(&req, buf);
    V1beta1__AllocateRequest *back = v1beta1__allocate_request__unpack(NULL, len, buf);
    assert_non_null(back);
    assert_int_equal(back->n_container_requests, 1);
    assert_int_equal(back->container_requests[0]->n_devices_ids, 3);
    assert_string_equal(back->container_requests[0]->devices_ids[2], "GPU-a::2");
    v1beta1__allocate_request__free_unpacked(back, NULL);

    /* What kgpu answers: envs (a map) and a read-only mount. */
    V1beta1__ContainerAllocateResponse__EnvsEntry e1 =
        V1BETA1__CONTAINER_ALLOCATE_RESPONSE__ENVS_ENTRY__INIT;
    e1.key = "NVIDIA_VISIBLE_DEVICES";
    e1.value = "GPU-a";
    V1beta1__ContainerAllocateResponse__EnvsEntry *envs[] = {&e1};
    V1beta1__Mount m = V1BETA1__MOUNT__INIT;
    m.container_path = "/etc/ld.so.preload";
    m.host_path = "/var/lib/kgpu/ld.so.preload";
    m.read_only = 1;
    V1beta1__Mount *mounts[] = {&m};
    V1beta1__ContainerAllocateResponse cres = V1BETA1__CONTAINER_ALLOCATE_RESPONSE__INIT;
    cres.n_envs = 1;
    cres.envs = envs;
    cres.n_mounts = 1;
    cres.mounts = mounts;
    V1beta1__ContainerAllocateResponse *cress[] = {&cres};
    V1beta1__AllocateResponse res = V1BETA1__ALLOCATE_RESPONSE__INIT;
    res.n_container_responses = 1;
    res.container_responses = cress;
    len = v1beta1__allocate_response__pack(&res, buf);
    V1beta1__AllocateResponse *rb = v1beta1__allocate_response__unpack(NULL, len, buf);
    assert_non_null(rb);
    assert_int_equal(rb->container_responses[0]->n_envs, 1);
    assert_string_equal(rb->container_responses[0]->envs[0]->key, "NVIDIA_VISIBLE_DEVICES");
    assert_string_equal(rb->container_responses[0]->envs[0]->value, "GPU-a");
    assert_true(rb->container_responses[0]->mounts[0]->read_only);
    v1beta1__allocate_response__free_unpacked(rb, NULL);
}

static void test_truncated_input_refused(void **state)
{
    /* A device ID that claims 10 bytes but has 2: unpack must refuse, not read past. */
    static const uint8_t bad[] = {0x0a, 0x0c, 0x0a, 10, 'a', 'b'};
    assert_null(v1beta1__allocate_request__unpack(NULL, sizeof(bad), bad));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_wire_bytes),
        cmocka_unit_test(test_register_request_bytes),
        cmocka_unit_test(test_allocate_round_trip),
        cmocka_unit_test(test_truncated_input_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
