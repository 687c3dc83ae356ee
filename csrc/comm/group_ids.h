// NCCL unique ids of this process's tensor-parallel groups, looked up by group token.
//
// An overlapped call's HLO names its group by a token (kGroupTokenBytes bytes, derived from the
// group's devices and communicator options by fo_jax/_bootstrap.py), not by the NCCL unique id:
// the token is the same in every run, so the compiled module is too and JAX's persistent
// compilation cache can hit, while the unique id is new in every run. Lowering the call
// registers the token's unique id here; the FFI handler resolves it when the call runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fo_jax {

inline constexpr size_t kGroupTokenBytes = 32;
inline constexpr size_t kGroupUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

// Records `unique_id` (kGroupUniqueIdBytes) for `token` (kGroupTokenBytes); a later
// registration of the same token replaces it (a re-lowering that made a new id). Thread-safe.
void RegisterGroupUniqueId(const std::string& token, const std::string& unique_id);

// Copies the unique id registered for `token` (kGroupTokenBytes bytes) into `unique_id`
// (kGroupUniqueIdBytes bytes); false when none is registered in this process.
bool FindGroupUniqueId(const uint8_t* token, char* unique_id);

}  // namespace fo_jax
