"""One copy-engine form on all local GPUs of one process, with FO_JAX_TEST_FAIL=stop:<rank> and
FO_JAX_COMM_TIMEOUT_S set by the test (tests/gpu/overlap/test_reliability_gpu.py): every call of
that rank enqueues nothing, so its peers wait for words that never come, as for an XLA thread
that stopped calling. The progress watchdog must release them (the all-gather: its copy threads
give up on the rank) or end the process with exit status 70; no call may hang. Arguments: the
form (a key of overlap_forms.FORMS). Prints "CALL <i> RAISED|RETURNED <seconds> <first line>"
per call, then "WORKER OK", and leaves at once (os._exit: the GPU may still hold released calls
of the stopped rank's peers)."""

import os
import sys

from call_report import report_calls
from overlap_forms import form_call

CALLS = 3

f, args = form_call(sys.argv[1])
report_calls(f, args, CALLS)
print("WORKER OK", flush=True)
os._exit(0)
