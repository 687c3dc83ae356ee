"""One JAX process per GPU with the copy engine across processes (launched by
tests/gpu/overlap/test_reliability_gpu.py with FO_JAX_COMM_TIMEOUT_S set): the last process
SIGKILLs itself right after dispatching its fourth call, with no chance to publish anything. The
others wait for its flags until their progress watchdog releases them (or ends the process with
exit status 70); a survivor exits with status 1 as soon as a call raises. Prints "CALL <i>
RAISED|RETURNED <seconds> <first line>" per call; "NO RAISE" if none raised."""

import os
import signal
import sys

import jax

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc,
                           local_device_ids=[proc])
from call_report import report_calls  # noqa: E402
from ipc_cases import sharded_call  # noqa: E402

CALLS = 20
f, (xg, wg), _ = sharded_call(nproc)
report_calls(f, (xg, wg), 3)
if proc == nproc - 1:
    f(xg, wg)  # dispatched, not awaited: the peers' copies of this call may be under way
    print("KILLING MYSELF", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    report_calls(f, (xg, wg), CALLS - 3, raise_errors=True, first=3)
except Exception:  # noqa: BLE001 - reported by report_calls
    os._exit(1)
print("NO RAISE", flush=True)
os._exit(0)
