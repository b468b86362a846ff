"""Container images for the node suite, made here: no registry is reachable.

An image is a docker-archive tarball (manifest.json, the image config, one
layer) that `ctr images import` reads; the layer holds the given files and,
for every dynamically linked one, the shared objects the loader resolves
for it on this machine (read from `ldd`), at the same paths. So the images
carry this machine's glibc, which is what the fake driver and
libkgpu-limit.so were built against.

Two images made here: the pod sandbox (a static `pause`, under the name the
runtime's sandbox_image setting gives, as kubelet's runtime expects it
there) and the job image (gpu_job built dynamically, statically, and
statically on musl where musl-gcc is installed), from C sources in
tests/e2e/node/ with the machine's cc. The image the Helm chart names is
kgpu's own, built by scripts/image.sh from the Dockerfile as users build it.
The install suite adds the upstream kube-scheduler's image (kube_scheduler_image),
since kgpu's own-scheduler mode runs it.
"""

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "node")
REPO = os.path.dirname(os.path.dirname(HERE))

PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"  # kubeadm's for Kubernetes 1.37
JOB_IMAGE = "kgpu-e2e.local/gpu-job:1"
# The image the Helm chart's DaemonSet names; no such image is published, so the
# node suite makes it: what the chart's containers run, from this build.
KGPU_IMAGE = "ghcr.io/kgpu/kgpu:0.1.0"


def compile_c(source, out, static=False, cc="cc"):
    argv = [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", out, os.path.join(SRC, source)]
    argv += ["-static"] if static else []
    argv += ["-ldl"]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # glibc's linker note about dlopen in static programs is expected, not an error.
    if r.returncode != 0:
        raise RuntimeError("cc %s failed:\n%s" % (source, r.stdout))
    return out


def shared_deps(path):
    """Absolute paths of the shared objects `path` loads (none for a static file)."""
    r = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or "not a dynamic executable" in r.stdout:
        return []
    out = []
    for line in r.stdout.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            out.append(m.group(1))
    return out


def _add_file(tar, src, dest, mode=None):
    st = os.stat(src)  # follows links: the image gets the file itself
    info = tarfile.TarInfo(dest.lstrip("/"))
    info.size, info.mode, info.mtime = st.st_size, mode or (st.st_mode & 0o777), 0
    with open(src, "rb") as f:
        tar.addfile(info, f)


def _add_dir(tar, dest):
    info = tarfile.TarInfo(dest.lstrip("/"))
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    tar.addfile(info)


def layer(files, libs_for=()):
    """A layer tarball (bytes) of files {image path: host path}, plus the shared objects
    that the files named in libs_for need, each where this machine's loader finds it
    (and where the dynamic loader is: the PT_INTERP path, e.g. /lib64/ld-linux-x86-64.so.2)."""
    wanted = dict(files)
    for host in list(libs_for):
        for dep in shared_deps(host):
            wanted.setdefault(dep, dep)
            real = os.path.realpath(dep)
            wanted.setdefault(real, real)
    dirs = set()
    for dest in wanted:
        d = os.path.dirname(dest)
        while d not in ("/", ""):
            dirs.add(d)
            d = os.path.dirname(d)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for d in sorted(dirs):
            _add_dir(tar, d)
        for dest in ("/tmp", "/etc", "/proc", "/sys", "/dev"):
            if dest not in dirs:
                _add_dir(tar, dest)
        for dest, src in sorted(wanted.items()):
            _add_file(tar, src, dest)
    return buf.getvalue()


def docker_archive(path, name, layer_bytes, entrypoint, cmd=None, env=None):
    """Writes a docker-archive of one layer that `ctr images import` takes under `name`."""
    diff = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": entrypoint, "Cmd": cmd,
                         "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                                        "/sbin:/bin"],
                         "WorkingDir": "/"},
              "rootfs": {"type": "layers", "diff_ids": [diff]},
              "history": [{"created_by": "tests/e2e/node_images.py"}]}
    cbytes = json.dumps(config, sort_keys=True).encode()
    cname = hashlib.sha256(cbytes).hexdigest() + ".json"
    lname = diff.split(":")[1] + "/layer.tar"
    manifest = [{"Config": cname, "RepoTags": [name], "Layers": [lname]}]
    with tarfile.open(path, "w") as tar:
        for fname, data in ((cname, cbytes), (lname, layer_bytes),
                            ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(fname)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return path


def kgpu_image(workdir, build_dir=None, dra=False):
    """The image the Helm chart's pods name, exactly as users build it: scripts/image.sh
    (the Dockerfile, from a Debian base made here), saved as a docker-archive. It holds
    kgpu-device-plugin, kgpu-dra-plugin, kgpu-extender and kgpu, the interception library
    and busybox for the install-shim script; build_dir and dra are not needed for it."""
    path = os.path.join(workdir, "kgpu.tar")
    r = subprocess.run([os.path.join(REPO, "scripts", "image.sh"), "--tag", KGPU_IMAGE,
                        "--save", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError("scripts/image.sh failed:\n%s" % r.stdout[-3000:])
    return KGPU_IMAGE, path


def kube_scheduler_image(workdir, binary, version):
    """registry.k8s.io/kube-scheduler:VERSION as kgpu's chart names it (ownScheduler), made
    from the kube-scheduler scripts/upstream.sh built: the binary on the PATH, with the
    shared objects it loads (none when Go built it static)."""
    name = "registry.k8s.io/kube-scheduler:" + version
    path = os.path.join(workdir, "kube-scheduler.tar")
    os.makedirs(workdir, exist_ok=True)
    docker_archive(path, name, layer({"/usr/local/bin/kube-scheduler": binary},
                                     libs_for=[binary]), entrypoint=None)
    return name, path


def build_all(workdir, preloaded=()):
    """Builds both images into workdir; returns [(image name, archive path)]. The job
    image also carries what the shared objects in `preloaded` (libkgpu-limit.so and the
    fake driver, mounted in at run time) need from the C library."""
    os.makedirs(workdir, exist_ok=True)
    pause = compile_c("pause.c", os.path.join(workdir, "pause"), static=True)
    job = compile_c("gpu_job.c", os.path.join(workdir, "gpu_job"))
    job_static = compile_c("gpu_job.c", os.path.join(workdir, "gpu_job_static"), static=True)
    files = {"/bin/gpu_job": job, "/bin/gpu_job_static": job_static}
    if shutil.which("musl-gcc"):  # Debian's musl-tools: a program on another C library
        files["/bin/gpu_job_musl"] = compile_c("gpu_job.c", os.path.join(workdir, "gpu_job_musl"),
                                               static=True, cc="musl-gcc")
    out = []
    out.append((PAUSE_IMAGE, docker_archive(os.path.join(workdir, "pause.tar"), PAUSE_IMAGE,
                                            layer({"/pause": pause}), ["/pause"])))
    out.append((JOB_IMAGE, docker_archive(
        os.path.join(workdir, "gpu-job.tar"), JOB_IMAGE,
        layer(files, libs_for=[job] + list(preloaded)),
        ["/bin/gpu_job"], ["show"])))
    return out

# What gpu_job prints and returns, as the suites read it.
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
CTX_MIB = 300  # what libkgpu-limit.so charges for a context at least (docs/shim.md)


def parse_job(text):
    """gpu_job's "key value" lines: {key: [values...]} (last line of a key wins in .get)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


def first_int(values):
    """The first number of the last of a key's values."""
    return int(values[-1].split()[0])
