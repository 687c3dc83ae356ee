// See group_counters.h.
#include "comm/group_counters.h"

#include <algorithm>

namespace fo_jax {

Status ZeroCountersPastGroups(const GroupCounters& counters, int num_groups,
                              cudaStream_t stream) {
  if (num_groups >= kMaxGemmGroups) return Status::Ok();
  return CudaStatus(cudaMemsetAsync(counters.words + num_groups, 0,
                                    size_t(kMaxGemmGroups - num_groups) * sizeof(uint32_t),
                                    stream),
                    "zeroing the group counters");
}

CountedCall BeginCountedCall(const GroupCounters& counters) {
  CountedCall call;
  call.zero = counters.zero_next;
  if (!call.zero) std::copy(counters.total, counters.total + kMaxGemmGroups, call.base);
  return call;
}

void EndCountedCall(GroupCounters& counters, const CountedCall& call,
                    const SignalingGemmArgs& gemm, bool counted) {
  if (!counted) {
    counters.zero_next = true;
    return;
  }
  std::copy(call.base, call.base + kMaxGemmGroups, counters.total);
  for (int g = 0; g < gemm.num_groups; ++g) {
    counters.total[g] += static_cast<uint32_t>(ExpectedGroupCount(gemm, g));  // wraps mod 2^32
  }
  counters.zero_next = false;
}

}  // namespace fo_jax
