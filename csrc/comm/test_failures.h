// Fault injection for the reliability tests (FO_JAX_TEST_FAIL=<stage>:<rank>, parsed by
// fo_jax/_env.py and passed in by the module's set_test_hooks): that rank of every fo_jax group
// fails at that stage as the real failure would, so that a test on healthy GPUs can check that
// no rank waits for it (docs/design.md, "Failure handling"). The receive-buffer allocation
// ("alloc") keeps its own hook in copy_engine_buffers.h; this file holds the stages after the
// address exchange.
#pragma once

#include <string>

namespace fo_jax {

enum class FailStage {
  kNone = 0,
  kGraph,   // building the copy-engine call's copy graphs (XLA's thread, after the exchange)
  kLaunch,  // launching the call's GEMM (either transport)
  kCopy,    // the copy worker enqueueing a copy-engine call's copies (its hand-off)
  kSetup,   // creating a group's copy-engine state (its first copy-engine call, before any
            // exchange with the peers)
  kStop,    // not a failure: every copy-engine call of the rank enqueues nothing and returns
            // success, which its peers cannot tell from a rank that stopped calling (the
            // progress watchdog's case, copy_engine_watchdog.h)
};

// The stage named `name` ("graph", "launch", "copy", "setup", "stop"; "" is kNone); false if
// unknown.
bool FailStageFromName(const std::string& name, FailStage* stage);

// From now on, rank `rank` of every group fails at `stage` (kNone: no rank fails).
void SetTestFailureForTests(FailStage stage, int rank);

// Whether rank `rank` is to fail at `stage` now.
bool TestFailureAt(FailStage stage, int rank);

// The message of an injected failure at `stage` ("... [injected by FO_JAX_TEST_FAIL=<stage>]").
std::string InjectedFailureMessage(FailStage stage);

}  // namespace fo_jax
