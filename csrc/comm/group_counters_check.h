// One-GPU verification of the communicator's GEMM group counters across calls
// (group_counters.h), for tests: real overlapped calls (OverlapCall on the NCCL transport) on a
// one-rank communicator of the check's own (a fresh unique id), one after another, each with the
// group table the check is given, some made to fail at the GEMM's launch (test_failures.h).
//
// After each call the check reads the communicator's kMaxGemmGroups counter words and its host
// totals. After a call that succeeded every word must equal its total: that is the base the next
// call's waits add its counts to. The check fills the words with `garbage` before the first call
// and after every failed call, as cudaMalloc or a failed group may leave them, so a call that
// zeroes must clear every word, not only its own groups'. Each call's output, filled with stale
// bytes first, is compared bit for bit with the same GEMM run without signals: a wait that passed
// before its tiles were written moves the stale bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/overlap_plan.h"

namespace fo_jax {

struct GroupCountersCheckCall {
  std::vector<int> group_begin;  // the call's group table (tile-rows), 1 to kMaxGemmGroups groups
  bool fail_launch = false;      // the call's GEMM "fails to launch" (FailStage::kLaunch)
};

struct GroupCountersCheckStep {
  bool zeroed = false;     // the call zeroed the counters before its GEMM
  bool ok = false;         // the call returned Ok
  std::string message;     // its status's message
  bool out_equal = false;  // its output equals the unsignalled GEMM's, bit for bit
  std::vector<uint32_t> words;   // the counter words after the call
  std::vector<uint32_t> totals;  // the communicator's totals after the call
};

struct GroupCountersCheckResult {
  std::vector<GroupCountersCheckStep> steps;
  // "" when every call ran. A call whose work did not finish within timeout_s is released (every
  // word raised 2^30 past its total) and ends the check with an error naming it.
  std::string error;
};

// The calls are x[m, k] @ w[k, n] in bf16 on GEMM config `config` (an index), `collective`
// kReduceScatter or kAllReduce. start_total >= 0: before the first call the words and totals are
// set to that value, as if earlier calls had counted that far (the wrap: the waits compare
// modulo 2^32); otherwise the communicator is new and its first call zeroes.
GroupCountersCheckResult RunGroupCountersCheck(Collective collective, int config, int64_t m,
                                               int64_t n, int64_t k,
                                               const std::vector<GroupCountersCheckCall>& calls,
                                               uint32_t garbage, int64_t start_total,
                                               double timeout_s);

}  // namespace fo_jax
