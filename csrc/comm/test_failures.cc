// See test_failures.h.
#include "comm/test_failures.h"

#include <atomic>

namespace fo_jax {
namespace {

std::atomic<int> g_stage{static_cast<int>(FailStage::kNone)};
std::atomic<int> g_rank{-1};

const char* StageName(FailStage stage) {
  switch (stage) {
    case FailStage::kGraph: return "graph";
    case FailStage::kLaunch: return "launch";
    case FailStage::kCopy: return "copy";
    case FailStage::kSetup: return "setup";
    case FailStage::kStop: return "stop";
    case FailStage::kNone: break;
  }
  return "";
}

}  // namespace

bool FailStageFromName(const std::string& name, FailStage* stage) {
  for (FailStage s : {FailStage::kNone, FailStage::kGraph, FailStage::kLaunch, FailStage::kCopy,
                      FailStage::kSetup, FailStage::kStop}) {
    if (name == StageName(s)) {
      *stage = s;
      return true;
    }
  }
  return false;
}

void SetTestFailureForTests(FailStage stage, int rank) {
  g_rank.store(rank);
  g_stage.store(static_cast<int>(stage));
}

bool TestFailureAt(FailStage stage, int rank) {
  return stage != FailStage::kNone && g_stage.load() == static_cast<int>(stage) &&
         g_rank.load() == rank;
}

std::string InjectedFailureMessage(FailStage stage) {
  return std::string("[injected by FO_JAX_TEST_FAIL=") + StageName(stage) + "]";
}

}  // namespace fo_jax
