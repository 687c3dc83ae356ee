"""One overlapped form on all local GPUs of one process, with FO_JAX_TEST_FAIL=<stage>:<rank> set
by the test (tests/gpu/overlap/test_reliability_gpu.py): that rank fails at that stage after the
address exchange (a copy graph build, the GEMM launch, the copy thread's hand-off) on every call.
The other ranks must not wait for it: each call returns or raises promptly, and once one raised
every later call raises (the group is failed). Arguments: the form (a key of
overlap_forms.FORMS). Prints "CALL <i> RAISED|RETURNED <seconds> <first line of the error>" per
call, then "WORKER OK", and leaves through the interpreter's normal exit (the copy threads and
CUDA torn down as usual)."""

import sys

from call_report import report_calls
from overlap_forms import form_call, form_reference

CALLS = 3

f, args = form_call(sys.argv[1])
report_calls(f, args, CALLS, expected=form_reference(sys.argv[1], args))
print("WORKER OK", flush=True)
