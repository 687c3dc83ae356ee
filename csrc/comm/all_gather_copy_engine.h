// The all-gather's copy-engine transport (docs/design.md, "The all-gather"): every rank pushes
// its rows into each peer's gathered output (the peer's XLA result of this very call) with
// copy-engine writes, each followed by the peer's band flag (a stream write, which fences the
// copy); no SM moves data, so the consumer GEMM may use every SM. The per-call destination is
// exchanged on the host: each rank's handler publishes (epoch, gathered output, flags, "call
// started" event) in the group's table (ag_exchange.h: in this process, or a shared-memory
// segment where the group spans processes of this host, all_gather_peers.h), and each rank's
// copy thread waits on the host for the peer's entry and on the GPU for its event (the peer's
// stream has zeroed the flags and may be written), then launches its copy graphs
// (copy_engine_graphs.h: never a call that can block on a driver lock while a peer drains).
// XLA's stream waits (a stream memory operation, not an event the thread records later) until
// this rank's copies have read x.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "comm/all_gather_nccl.h"
#include "comm/copy_engine_graphs.h"
#include "comm/comm_registry.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "kernels/signaling_gemm.h"

namespace fo_jax {

// Before the call (OverlapCall::Prepare, where the other copy-engine collectives make their
// exchange): on this rank's first call, its state (copy stream, ring of events, device word)
// and the group's exchange; when the group spans processes, the connection to the peers in the
// other processes (all_gather_peers.h), collective: every rank of the group makes it in the
// same call. Afterwards a no-op.
Status PrepareAllGatherCopyEngine(CommState& state, const OverlapPlan& plan,
                                  const OverlapShape& shape, const AllGatherBuffers& buffers);

// Enqueues the whole call (after PrepareAllGatherCopyEngine): on XLA's stream the flags zeroed,
// the own rows and their flags, the "call started" event, the consumer GEMM, then the wait for
// this rank's copies; the copies on the copy thread. Returns, after the call ran, the copy thread's first failure if it had one.
// `gemm` as for EnqueueAllGatherNccl.
Status EnqueueAllGatherCopyEngine(CommState& state, cudaStream_t xla_stream,
                                  const OverlapPlan& plan, const OverlapShape& shape,
                                  SignalingGemmArgs gemm, const AllGatherBuffers& buffers);

// The copies of one sender's rows into one receiver, on `stream`: for each of its per_rank bands
// c, a launch of copy graph (peer, c) from src + c * band_bytes to band first_band + c of
// `gathered`, then that band's flag in `flags` set to 1 (a stream write, which fences the copy).
// A band whose copy cannot be enqueued (this one's or an earlier one's launch failed) is
// released instead (EnqueueBandRelease): the receiver's GEMM waits for every flag, and its rows
// then read as failed. Returns the first failure. The transport's copy thread and the one-GPU
// check (comm/all_gather_check.h) both push this way.
Status EnqueueBandPushes(CopyGraphs& graphs, int peer, cudaStream_t stream, const char* src,
                         char* gathered, uint32_t* flags, int first_band, int per_rank,
                         size_t band_bytes);

// The release of `count` bands, from first_band on, whose rows will not come (their sender never
// reached the call, or could not enqueue its copies): on `stream`, each band's rows of `gathered`
// set to NaNs (EnqueueNanFill: copy-engine writes, which need no SM of the GEMM that waits), then
// its flag in `flags` set to 1. The consumer GEMM then reads NaN rows, so the call's product rows
// from those bands (NaN times anything is NaN) and its gathered rows read as failed instead of
// holding whatever the memory held. `gathered` and `flags` may be a peer's. Every flag is
// written even after a failed fill; returns the first failure.
Status EnqueueBandRelease(cudaStream_t stream, char* gathered, uint32_t* flags, int first_band,
                          int count, size_t band_bytes);

}  // namespace fo_jax
