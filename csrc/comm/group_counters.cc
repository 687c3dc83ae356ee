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

bool BeginCountedCall(GroupCounters& counters) {
  if (counters.zero_next) std::fill(counters.total, counters.total + kMaxGemmGroups, 0u);
  return counters.zero_next;
}

void EndCountedCall(GroupCounters& counters, const SignalingGemmArgs& gemm, bool counted) {
  if (!counted) {
    counters.zero_next = true;
    return;
  }
  for (int g = 0; g < gemm.num_groups; ++g) {
    counters.total[g] += static_cast<uint32_t>(ExpectedGroupCount(gemm, g));  // wraps mod 2^32
  }
  counters.zero_next = false;
}

}  // namespace fo_jax
