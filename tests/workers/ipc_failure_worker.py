"""One JAX process per GPU with the copy engine across processes, or with the NCCL transport if
FAILURE_WORKER_TRANSPORT=nccl; the reduce-scatter, or the all-reduce or the overlapped all-gather if
FAILURE_WORKER_COLLECTIVE=all_reduce or all_gather (launched by
tests/gpu/overlap/test_reliability_gpu.py with FO_JAX_TEST_FAIL=<stage>:<last rank>): the last rank
fails at that stage on every call, after its peers in the other processes may wait for it. It
releases what they wait for and fails its group; the other processes learn the failure through JAX's
key-value store (fo_jax/_failure_watch.py) and their later calls raise. Prints "CALL <i>
RAISED|RETURNED <seconds> <first line>" per call and "WORKER OK process <p>", then leaves with the
others (leave_together.py)."""

import os
import sys

import jax

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
from call_report import report_calls  # noqa: E402
from ipc_cases import sharded_call  # noqa: E402
from leave_together import leave_together  # noqa: E402

CALLS = 6
f, (xg, wg), ref = sharded_call(nproc, os.environ.get("FAILURE_WORKER_TRANSPORT", "copy_engine"),
                                os.environ.get("FAILURE_WORKER_COLLECTIVE", "reduce_scatter"))
# The failure watch polls once a second: after 2.5 s every process's watch has handled the failure
# before its next call, so the calls after it run on a group the watch failed (not aborted: a
# copy-engine group keeps running in step), the order in which an abort would leave peers waiting.
report_calls(f, (xg, wg), CALLS, pause_s=2.5, expected=ref)
print(f"WORKER OK process {proc}", flush=True)
leave_together()
