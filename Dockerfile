# kgpu's container image: kgpu-extender, kgpu-device-plugin,
# kgpu-dra-plugin, kgpu-expander, kgpu-dispatcher and kgpu on PATH, the interception library at
# /usr/lib/kgpu/libkgpu-limit.so, and a static busybox for the chart's
# install-shim script (sh, mkdir, cp, chmod, mv). The device plugin's and
# the DRA driver's fake-GPU modes are in their binaries.
#
# Build it with scripts/image.sh: it makes the Debian base named by BASE
# from Debian's own packages (debootstrap, then docker import), as no
# registry needs to be reachable, and then runs an ordinary docker build.
# docs/install.md, "The image", says what is in it and why.
ARG BASE=kgpu.local/debian:bookworm

# ---- build: the Release binaries, from the sources alone (.dockerignore) ----
FROM ${BASE} AS build
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      build-essential cmake pkg-config libjansson-dev libmicrohttpd-dev libgnutls28-dev \
      libcurl4-openssl-dev libyaml-dev libprotobuf-c-dev protobuf-c-compiler libgrpc-dev \
      liblz4-dev libzstd-dev \
      busybox-static >/dev/null \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DKGPU_BUILD_TESTS=OFF >/dev/null \
 && cmake --build /build -j"$(nproc)" \
      --target kgpu kgpu-extender kgpu-device-plugin kgpu-dra-plugin kgpu-expander kgpu-dispatcher \
               kgpu-limit >/dev/null \
 && DESTDIR=/stage cmake --install /build --prefix /usr >/dev/null

# The runtime's whole file system: the binaries, exactly the shared
# libraries the loader resolves for them (their ldd closure, from Debian's
# packages above), busybox, and a user without a shell. No package
# manager, no libraries nothing uses.
RUN set -eu; r=/rootfs; \
    mkdir -p "$r/usr/bin" "$r/usr/lib/kgpu" "$r/bin" "$r/etc" "$r/tmp"; \
    chmod 1777 "$r/tmp"; \
    cp -a /stage/usr/bin/. "$r/usr/bin/"; \
    cp /stage/usr/lib/kgpu/libkgpu-limit.so "$r/usr/lib/kgpu/"; \
    cp /bin/busybox "$r/bin/busybox"; \
    for tool in sh mkdir cp chmod mv cat ls rm ln; do ln -s busybox "$r/bin/$tool"; done; \
    for f in "$r"/usr/bin/kgpu*; do [ -L "$f" ] || ldd "$f"; done \
      | sed -n -e 's|.*=> \(/[^ ]*\) (0x.*|\1|p' -e 's|^[[:space:]]*\(/[^ ]*\) (0x.*|\1|p' \
      | sort -u > /tmp/libs; \
    while read -r lib; do mkdir -p "$r$(dirname "$lib")"; cp -L "$lib" "$r$lib"; done < /tmp/libs; \
    printf 'root:x:0:0::/:/bin/false\nkgpu:x:65532:65532::/nonexistent:/bin/false\n' > "$r/etc/passwd"; \
    printf 'root:x:0:\nkgpu:x:65532:\n' > "$r/etc/group"; \
    printf 'hosts: files dns\n' > "$r/etc/nsswitch.conf"

# ---- runtime ----
FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/usr/bin:/bin
# The chart runs the extender as this user; the node agents as root, which
# they need for kubelet's sockets and the host's folders.
USER 65532:65532
ENTRYPOINT ["/usr/bin/kgpu"]
CMD ["--help"]
