"""CPU stand-in for the one-process-per-GPU failure workers' ending (tests/cpu/test_worker_exit.py):
process 0 finishes first and the others 1.5 s apart, as processes whose calls raise at different
times. Then `together`: leave_together(); `linger`: sleep a fixed 2 s and os._exit(0), which lets
process 0 (the coordination service's host) leave while the others still run.

Usage: leave_order_worker.py PROC NPROC PORT together|linger"""

import os
import sys
import time

import jax

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.config.update("jax_platforms", "cpu")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc)
from leave_together import leave_together  # noqa: E402

time.sleep(1.5 * proc)
print(f"WORKER OK process {proc}", flush=True)
if sys.argv[4] == "together":
    leave_together()
time.sleep(2.0)
os._exit(0)
