"""Can another process address XLA's own buffers? Checks the way the copy-engine all-reduce and
all-gather could cross processes without staging (docs/design.md, "Copy engine across
processes"): an XLA buffer's allocation (cuMemGetAddressRange) is exported with the legacy CUDA
IPC API by its owner, opened by a second process on another GPU, read there at the buffer's offset
and written, and the owner's JAX then sees the peer's write.

Two processes, GPU 0 (owner) and GPU 1 (peer), each seeing only its own GPU; one row per
allocator mode: JAX's default (preallocated BFC pool), no preallocation (BFC growing by regions),
and the platform allocator (one cuMemAlloc per buffer). Prints one JSON line per mode (and writes
them to --out): whether the owner's buffers share one region, the pointer attributes of the
region (legacy-IPC capable, allowed handle types), the export's result, what the peer read and
whether its write came back. Needs no fo_jax.

Usage: python dev/probes_py/xla_pool_ipc_probe.py [--out rows.jsonl]
"""
import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

MODES = {
    "preallocated": {},
    "no_preallocation": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "platform_allocator": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
    # Both processes see both GPUs (each preallocating on both: 40% each), owner on 0, peer on 1.
    "all_visible": {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.4"},
}
N = 1 << 20  # float32 elements of the buffer the peer reads and writes
HANDLE_BYTES = 64
DEV = int(os.environ.get("PROBE_DEVICE", "0"))  # this process's device (ordinal it sees)


def _cuda():
    cu = ctypes.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), DEV), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
    return cu


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def _attr(cu, attr, ptr):
    v = ctypes.c_uint64(0)
    rc = cu.cuPointerGetAttribute(ctypes.byref(v), attr, ctypes.c_uint64(ptr))
    return v.value if rc == 0 else f"CUresult {rc}"


def owner(d):
    import jax
    import jax.numpy as jnp
    import numpy as np

    dev = jax.devices()[DEV]
    x = jax.device_put(jnp.arange(N, dtype=jnp.float32), dev)
    big = jax.device_put(jnp.ones((256, 1 << 20), jnp.float32), dev)  # 1 GiB, after x
    y = jax.device_put(jnp.arange(N, dtype=jnp.float32) * 2, dev)
    jax.block_until_ready((x, big, y))
    cu = _cuda()
    row = {"device": jax.devices()[0].device_kind}
    regions = []
    for name, a in (("x", x), ("big", big), ("y", y)):
        p = a.unsafe_buffer_pointer()
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        check(cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                         ctypes.c_uint64(p)), "cuMemGetAddressRange")
        regions.append((name, base.value, size.value, p - base.value))
    row["regions"] = {n: {"base": hex(b), "GiB": round(s / 2**30, 3), "offset": o}
                      for n, b, s, o in regions}
    row["one_region"] = len({b for _, b, _, _ in regions}) == 1
    _, base, size, off = regions[0]
    # CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
    row["legacy_ipc_capable"] = _attr(cu, 10, base)
    row["allowed_handle_types"] = _attr(cu, 14, base)  # CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
    handle = (ctypes.c_char * HANDLE_BYTES)()
    rc = cu.cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(base))
    row["export"] = "ok" if rc == 0 else f"CUresult {rc}"
    # The virtual-memory route: the physical allocation behind x (cuMemRetainAllocationHandle),
    # exported as a POSIX file descriptor that travels over a Unix socket (SCM_RIGHTS).
    p = x.unsafe_buffer_pointer()
    map_base, map_size = _attr(cu, 19, p), _attr(cu, 18, p)  # MAPPING_BASE_ADDR, MAPPING_SIZE
    row["vmm_mapping"] = {n: {"base": hex(_attr(cu, 19, a.unsafe_buffer_pointer())),
                              "GiB": round(_attr(cu, 18, a.unsafe_buffer_pointer()) / 2**30, 3)}
                          for n, a in (("x", x), ("big", big), ("y", y))}
    fd, vmm_rc = -1, "no mapping attributes"
    if isinstance(map_base, int) and isinstance(map_size, int):
        alloc = ctypes.c_uint64()
        vmm_rc = cu.cuMemRetainAllocationHandle(ctypes.byref(alloc), ctypes.c_uint64(p))
        if vmm_rc == 0:
            cfd = ctypes.c_int(-1)
            vmm_rc = cu.cuMemExportToShareableHandle(ctypes.byref(cfd), alloc, 1,
                                                     ctypes.c_uint64(0))
            fd = cfd.value
            cu.cuMemRelease(alloc)
    row["vmm_export"] = "ok" if vmm_rc == 0 else f"CUresult {vmm_rc}"
    sock_path = os.path.join(d, "fd.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(1)
    with open(os.path.join(d, "handle.json.tmp"), "w") as f:
        json.dump({"rc": rc, "handle": bytes(handle).hex(), "offset": off,
                   "vmm_ok": vmm_rc == 0 and fd >= 0, "pid": os.getpid(), "fd": fd,
                   "vmm_size": map_size, "vmm_offset": p - map_base if vmm_rc == 0 else 0}, f)
    os.rename(os.path.join(d, "handle.json.tmp"), os.path.join(d, "handle.json"))
    srv.settimeout(120)
    conn, _ = srv.accept()
    socket.send_fds(conn, [b"f"], [fd] if fd >= 0 else [])
    conn.close()
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(d, "peer.json")) and time.time() < deadline:
        time.sleep(0.05)
    path = os.path.join(d, "peer.json")
    peer = json.load(open(path)) if os.path.exists(path) else {"error": "no answer"}
    row["peer"] = peer
    if peer.get("wrote"):
        got = np.asarray(x[:8])  # the first read of x from the device: after the peer's write
        row["peer_write_seen"] = bool((got == -1).all())
        row["rest_intact"] = bool((np.asarray(x[1024:4096]) == np.arange(1024, 4096)).all())
    print(json.dumps(row), flush=True)
    open(os.path.join(d, "owner.done"), "w").close()


def _pidfd_getfd(cu, h):
    """The other way for the descriptor to travel: taken from the owner by pid (pidfd_getfd, Linux
    5.6+, allowed where this process may ptrace the owner), then imported."""
    if not h.get("vmm_ok"):
        return "no export"
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, h["pid"], 0)  # pidfd_open
    if pidfd < 0:
        return f"pidfd_open errno {ctypes.get_errno()}"
    fd = libc.syscall(438, pidfd, h["fd"], 0)  # pidfd_getfd
    if fd < 0:
        return f"pidfd_getfd errno {ctypes.get_errno()}"
    alloc = ctypes.c_uint64()
    rc = cu.cuMemImportFromShareableHandle(ctypes.byref(alloc), ctypes.c_void_p(fd), 1)
    if rc == 0:
        cu.cuMemRelease(alloc)
    os.close(fd)
    os.close(pidfd)
    return "ok" if rc == 0 else f"import CUresult {rc}"


def peer(d):
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.block_until_ready(jax.device_put(jnp.zeros(1), jax.devices()[DEV]))  # its own context
    cu = _cuda()
    deadline = time.time() + 120
    path = os.path.join(d, "handle.json")
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.05)
    h = json.load(open(path))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(os.path.join(d, "fd.sock"))
    _, fds, _, _ = socket.recv_fds(conn, 16, 1)
    conn.close()
    out = {"wrote": False, "pidfd_getfd": _pidfd_getfd(cu, h)}
    addr = None
    if h["rc"] == 0:
        handle = (ctypes.c_char * HANDLE_BYTES).from_buffer_copy(bytes.fromhex(h["handle"]))
        dptr = ctypes.c_uint64()
        rc = cu.cuIpcOpenMemHandle_v2(ctypes.byref(dptr), handle, 1)  # lazy peer access
        out["open"] = "ok" if rc == 0 else f"CUresult {rc}"
        if rc == 0:
            addr = dptr.value + h["offset"]
    elif h["vmm_ok"] and fds:
        out["route"] = "vmm"
        alloc = ctypes.c_uint64()
        rc = cu.cuMemImportFromShareableHandle(ctypes.byref(alloc), ctypes.c_void_p(fds[0]), 1)
        out["import"] = "ok" if rc == 0 else f"CUresult {rc}"
        if rc == 0:
            va, size = ctypes.c_uint64(), ctypes.c_size_t(h["vmm_size"])
            t = time.perf_counter()
            steps = [("reserve", lambda: cu.cuMemAddressReserve(ctypes.byref(va), size,
                                                                ctypes.c_size_t(0),
                                                                ctypes.c_uint64(0),
                                                                ctypes.c_uint64(0))),
                     ("map", lambda: cu.cuMemMap(va, size, ctypes.c_size_t(0), alloc,
                                                 ctypes.c_uint64(0))),
                     ("access", lambda: cu.cuMemSetAccess(
                         va, size, ctypes.byref((ctypes.c_int * 3)(1, DEV, 3)),
                         ctypes.c_size_t(1)))]  # this GPU, read-write
            for name, step in steps:
                rc = step()
                out[name] = "ok" if rc == 0 else f"CUresult {rc}"
                if rc:
                    break
            out["map_ms"] = round((time.perf_counter() - t) * 1e3, 2)
            if rc == 0:
                addr = va.value + h["vmm_offset"]
    if addr is not None:
        try:
            host = np.empty(N, np.float32)
            check(cu.cuMemcpyDtoH_v2(host.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(addr),
                                     ctypes.c_size_t(host.nbytes)), "cuMemcpyDtoH")
            out["read_ok"] = bool((host == np.arange(N, dtype=np.float32)).all())
            minus = np.full(1024, -1, np.float32)
            check(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(addr), minus.ctypes.data_as(ctypes.c_void_p),
                                     ctypes.c_size_t(minus.nbytes)), "cuMemcpyHtoD")
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            out["wrote"] = True
        except RuntimeError as e:
            out["error"] = str(e)
    with open(os.path.join(d, "peer.json.tmp"), "w") as f:
        json.dump(out, f)
    os.rename(os.path.join(d, "peer.json.tmp"), os.path.join(d, "peer.json"))
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(d, "owner.done")) and time.time() < deadline:
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=("owner", "peer"))
    ap.add_argument("--dir")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.role:
        (owner if a.role == "owner" else peer)(a.dir)
        return
    rows = []
    for mode, extra in MODES.items():
        with tempfile.TemporaryDirectory() as d:
            procs = []
            for gpu, role in ((0, "owner"), (1, "peer")):
                env = dict(os.environ, JAX_PLATFORMS="cuda", **extra)
                if mode == "all_visible":
                    env.update(CUDA_VISIBLE_DEVICES="0,1", PROBE_DEVICE=str(gpu))
                else:
                    env.update(CUDA_VISIBLE_DEVICES=str(gpu), PROBE_DEVICE="0")
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--role", role, "--dir", d], env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            outs = [p.communicate(timeout=300) for p in procs]
            line = next((ln for ln in outs[0][0].splitlines() if ln.startswith("{")), None)
            row = json.loads(line) if line else {"error": (outs[0][1] + outs[1][1])[-2000:]}
            row = {"mode": mode, **row}
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
