"""CPU stand-in for the one-process-per-GPU failure workers' ending
(tests/cpu/test_workers_leave_together.py): process 0 finishes first and the others 1.5 s apart,
as processes whose calls raise at different times, then all end with leave_together().

Usage: leave_order_worker.py PROC NPROC PORT"""

import sys
import time

import jax

proc, nproc, port = (int(a) for a in sys.argv[1:4])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=proc)
from leave_together import leave_together  # noqa: E402

time.sleep(1.5 * proc)
print(f"WORKER OK process {proc}", flush=True)
leave_together()
