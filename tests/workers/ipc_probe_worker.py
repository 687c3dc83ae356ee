"""One JAX process per GPU (launched by tests/gpu/overlap/test_copy_engine_processes_gpu.py): the
lowering-time CUDA IPC probe of a reduce-scatter across processes with the default config, each
process seeing every GPU or, with FO_JAX_HIDE_OTHER_GPUS=1, only its own (CUDA_VISIBLE_DEVICES).
Prints the probe's verdict and the transport the call lowered to (a "PROBE" line, which must be
the same in every process); the result must match the float64 reference on whichever transport
the probe chose. The same call with OverlapConfig(copy_engine_multiprocess=False) must lower to
NCCL."""

import os
import sys

proc, nproc, port = (int(a) for a in sys.argv[1:4])
hide = os.environ.get("FO_JAX_HIDE_OTHER_GPUS") == "1"
if hide:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(proc)

import jax  # noqa: E402

jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[0 if hide else proc])
import fo_jax  # noqa: E402
from fo_jax import _process_layout  # noqa: E402
from ipc_cases import (check_shard, lowered_transport, operands, shard_operands,  # noqa: E402
                       tp_fn, tp_mesh)

mesh = tp_mesh()
x, w, ref = operands(4096, 1024, 512, nproc, 7)
xg, wg = shard_operands(mesh, x, w)
transports = fo_jax._cuda.module().Transport
f = tp_fn(mesh, fo_jax.OverlapConfig(allow_fallback=False))
copy_engine = lowered_transport(f, xg, wg) == transports["copy_engine"].value
off = tp_fn(mesh, fo_jax.OverlapConfig(allow_fallback=False, copy_engine_multiprocess=False))
assert lowered_transport(off, xg, wg) == transports["nccl"].value
print(f"PROBE transport {'copy_engine' if copy_engine else 'nccl'}, verdict "
      f"{_process_layout._ipc!r}", flush=True)
check_shard(f(xg, wg), ref, "reduce_scatter")
print(f"WORKER OK process {proc}/{nproc}", flush=True)
jax.distributed.shutdown()
