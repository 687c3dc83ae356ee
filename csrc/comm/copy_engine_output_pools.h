// The copy-engine all-reduce with peers in other processes of this host (docs/design.md, "Copy
// engine across processes"): its band sums store into the peers' per-call XLA outputs, so each
// rank maps, once per group, the XLA allocation that holds every peer's outputs
// (xla_pool_ipc.h: with JAX's default preallocation a GPU's whole pool), and each call's output
// address travels to a peer already translated into that peer's mapping
// (OutputAddressesForPeers, copy_engine_buffers.h).
#pragma once

#include <cstdint>
#include <string>

#include "comm/comm_registry.h"
#include "comm/copy_engine_buffers.h"
#include "comm/peer_pools.h"
#include "comm/status.h"

namespace fo_jax {

// Whether any peer of the group lives in another process (its memory reached over CUDA IPC).
bool HasPeersInOtherProcesses(const CommState& state, const CopyEngineBuffers& buffers);

static_assert(kPeerPoolRanks == kMaxCopyEngineRanks, "a pool per rank of a group");

// Collective (every rank of the group, in the same call): exports the allocation holding this
// rank's [buffer, buffer + bytes), hands its descriptor to each peer in another process over a
// Unix socket, maps each such peer's, and tells every peer where it mapped theirs (two
// all-gathers over the communicator). A rank whose export, hand-over or mapping fails reports it
// in the second all-gather, so every rank fails the call (none enqueues work that waits for
// another); `collective` names the call in that error ("all-reduce").
Status MapPeerPools(CommState& state, const void* buffer, uint64_t bytes,
                    const std::string& collective, PeerPools* out);

// On the group's first all-reduce with peers in other processes (every rank makes the same
// calls, so every rank joins): MapPeerPools for this rank's `out`, kept in `buffers`; after a
// failure the next all-reduce tries again. Afterwards a no-op.
Status MapOutputPools(CommState& state, CopyEngineBuffers& buffers, const void* out,
                      uint64_t out_bytes);

// Ok where this call's output lies inside the allocation the peers mapped (always, with JAX's
// preallocated pool), else why not. A rank's own finding, made after the exchange: the caller
// fails the call through the release (failed_call.h), so the peers do not wait for it.
Status OutputInPeersMapping(const CommState& state, const CopyEngineBuffers& buffers,
                            const void* out, uint64_t out_bytes);

}  // namespace fo_jax
