// See peer_transport.h.
#include "comm/peer_transport.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "comm/stream_wait.h"
#include "kernels/band_sum.h"

namespace fo_jax {
namespace {

struct PeerInfo {
  uint64_t recv;
  uint64_t sync;
  int32_t pid;
  int32_t device;
};

std::string Cuda(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

std::string CreatePeerState(CommState& s) {
  auto p = std::make_shared<PeerState>();
  int least = 0, greatest = 0;
  cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithPriority(&p->copy_stream, cudaStreamNonBlocking, greatest);
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->copies_done, cudaEventDisableTiming);
  if (e != cudaSuccess) return Cuda("creating the copy stream", e);
  e = cudaMalloc(&p->sync, 2 * kMaxPeerRanks * sizeof(uint32_t));
  if (e == cudaSuccess) e = cudaMalloc(&p->exchange, kMaxPeerRanks * sizeof(PeerInfo));
  if (e != cudaSuccess) return Cuda("allocating the copy-engine flags", e);
  e = cudaMemsetAsync(p->sync, 0, 2 * kMaxPeerRanks * sizeof(uint32_t), s.stream);
  if (e != cudaSuccess) return Cuda("zeroing the copy-engine flags", e);
  std::string err;
  if (LoadBandSumKernels(&err) != cudaSuccess) return err;
  s.peer = std::move(p);
  return "";
}

// After the band sum on XLA's stream: tell every sender that this rank's receive slots are free
// again, then wait for this rank's own copies (they read the workspace, which XLA may reuse).
cudaError_t Acknowledge(PeerState& p, cudaStream_t xla_stream, int P, int me, uint32_t e,
                        std::string* error) {
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    cudaError_t err = EnqueueWriteValue(xla_stream, p.peer_sync[q] + kMaxPeerRanks + me, e, error);
    if (err != cudaSuccess) return err;
  }
  cudaError_t err = cudaStreamWaitEvent(xla_stream, p.copies_done, 0);
  if (err != cudaSuccess) *error = "joining the copy stream into XLA's stream";
  return err;
}

}  // namespace

std::string PreparePeerTransport(CommState& s, size_t bytes) {
  if (cudaSetDevice(s.device) != cudaSuccess) return "cudaSetDevice";
  if (!s.peer) {
    std::string err = CreatePeerState(s);
    if (!err.empty()) return err;
  }
  PeerState& p = *s.peer;
  if (p.recv_bytes >= bytes) return "";
  // The old buffer stays allocated (cudaFree would synchronize the device while other work may
  // be in flight); doubling bounds how often that happens.
  const size_t capacity = std::max(bytes, 2 * p.recv_bytes);
  void* recv = nullptr;
  cudaError_t e = cudaMalloc(&recv, capacity);
  if (e != cudaSuccess) {
    return Cuda(("allocating " + std::to_string(capacity >> 20) +
                 " MiB for the copy-engine receive buffer (outside XLA's memory pool; lower "
                 "XLA_PYTHON_CLIENT_MEM_FRACTION or use OverlapConfig(transport='nccl'))").c_str(),
                e);
  }
  PeerInfo mine{reinterpret_cast<uint64_t>(recv), reinterpret_cast<uint64_t>(p.sync),
                static_cast<int32_t>(getpid()), s.device};
  auto* slots = static_cast<PeerInfo*>(p.exchange);
  std::vector<PeerInfo> all(s.nranks);
  e = cudaMemcpyAsync(slots + s.rank, &mine, sizeof(PeerInfo), cudaMemcpyHostToDevice, s.stream);
  if (e != cudaSuccess) return Cuda("address exchange", e);
  ncclResult_t r = ncclAllGather(slots + s.rank, slots, sizeof(PeerInfo), ncclUint8, s.comm,
                                 s.stream);
  if (r != ncclSuccess) {
    return std::string("address exchange (ncclAllGather): ") + ncclGetErrorString(r);
  }
  e = cudaMemcpyAsync(all.data(), slots, s.nranks * sizeof(PeerInfo), cudaMemcpyDeviceToHost,
                      s.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s.stream);
  if (e != cudaSuccess) return Cuda("address exchange", e);
  for (int q = 0; q < s.nranks; ++q) {
    if (q == s.rank) continue;
    if (all[q].pid != mine.pid) {
      return "the copy-engine transport needs every rank in one process (rank " +
             std::to_string(q) + " is in another); use OverlapConfig(transport='nccl')";
    }
    int ok = 0;
    e = cudaDeviceCanAccessPeer(&ok, s.device, all[q].device);
    if (e != cudaSuccess || !ok) {
      return "GPU " + std::to_string(s.device) + " cannot access GPU " +
             std::to_string(all[q].device) + " directly (no peer access); use "
             "OverlapConfig(transport='nccl')";
    }
    e = cudaDeviceEnablePeerAccess(all[q].device, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else if (e != cudaSuccess) {
      return Cuda("enabling peer access", e);
    }
    p.peer_recv[q] = reinterpret_cast<void*>(all[q].recv);
    p.peer_sync[q] = reinterpret_cast<uint32_t*>(all[q].sync);
  }
  p.recv = recv;
  p.recv_bytes = capacity;
  return "";
}

std::string PeerAccessProblem(const std::vector<int>& ordinals) {
  for (int a : ordinals) {
    for (int b : ordinals) {
      if (a == b) continue;
      int ok = 0;
      cudaError_t e = cudaDeviceCanAccessPeer(&ok, a, b);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return Cuda("cudaDeviceCanAccessPeer", e);
      }
      if (!ok) return "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b);
    }
  }
  return "";
}

cudaError_t EnqueuePeerReduceScatter(CommState& s, cudaStream_t xla_stream,
                                     const PeerReduceScatterArgs& a, std::string* error) {
  const int P = s.nranks, me = s.rank;
  if (P < 2 || P > kMaxPeerRanks) {
    *error = "copy-engine transport: 2 to " + std::to_string(kMaxPeerRanks) + " ranks";
    return cudaErrorInvalidValue;
  }
  const size_t band_bytes = a.band_elems * 2;
  if (!s.peer || s.peer->recv_bytes < (P - 1) * band_bytes) {
    *error = "copy-engine transport used before PreparePeerTransport";
    return cudaErrorInvalidValue;
  }
  PeerState& p = *s.peer;
  const uint32_t e = ++p.epoch;
  uint32_t* flags = p.sync;
  uint32_t* acks = p.sync + kMaxPeerRanks;
  const char* ws = static_cast<const char*>(a.workspace);
  char* recv = static_cast<char*>(p.recv);
  cudaStream_t cs = p.copy_stream;

  // Copy stream: after XLA's inputs are ready and every receiver has finished the previous call,
  // step j sends band (me + 1 + j) % P to its owner's slot j once the GEMM has finished it.
  cudaError_t err = cudaStreamWaitEvent(cs, s.inputs_ready, 0);
  if (err != cudaSuccess) {
    *error = "copy stream waiting for XLA's inputs";
    return err;
  }
  for (int q = 0; q < P; ++q) {
    if (q == me) continue;
    err = EnqueueWaitGeq(cs, acks + q, e - 1, a.spin_wait, error);
    if (err != cudaSuccess) return err;
  }
  const size_t first_bytes = a.first_part_elems * 2;
  const int shift = first_bytes > 0 ? 1 : 0;  // counter index of step j >= 1 is j + shift
  for (int j = 0; j + 1 < P; ++j) {
    const int to = (me + 1 + j) % P;
    char* dst = static_cast<char*>(p.peer_recv[to]) + j * band_bytes;
    const char* src = ws + to * band_bytes;
    size_t done = 0;
    if (j == 0 && first_bytes > 0) {  // the first band's first group, as soon as it is done
      err = EnqueueWaitGeq(cs, a.counters, a.expected[0], a.spin_wait, error);
      if (err != cudaSuccess) return err;
      err = cudaMemcpyAsync(dst, src, first_bytes, cudaMemcpyDeviceToDevice, cs);
      if (err != cudaSuccess) {
        *error = Cuda("copy to the peer GPU", err);
        return err;
      }
      done = first_bytes;
    }
    const int c = j == 0 ? shift : j + shift;
    err = EnqueueWaitGeq(cs, a.counters + c, a.expected[c], a.spin_wait, error);
    if (err != cudaSuccess) return err;
    err = cudaMemcpyAsync(dst + done, src + done, band_bytes - done, cudaMemcpyDeviceToDevice, cs);
    if (err != cudaSuccess) {
      *error = Cuda("copy to the peer GPU", err);
      return err;
    }
    err = EnqueueWriteValue(cs, p.peer_sync[to] + j, e, error);
    if (err != cudaSuccess) return err;
  }
  err = cudaEventRecord(p.copies_done, cs);
  if (err != cudaSuccess) {
    *error = "recording the copies' completion";
    return err;
  }

  // XLA's stream, after the GEMM (whose last band is this rank's own): sum the own band and the
  // P - 1 received ones, acknowledge to every sender, then wait for this rank's own copies (they
  // read the workspace, which XLA may reuse after the call). With split_sum the bands already
  // there are summed while the last one is in flight (the SMs are free by then), and only
  // out += last band remains after it: at 8192x8192x2048 the timeline showed the GPU idle ~50 us
  // between the GEMM's end and the last copy's, then a 52 us sum over all P bands; splitting
  // took the call from 0.564 to 0.538 ms. When every copy ends before the GEMM (long K), one
  // pass over the P bands moves fewer bytes.
  const void* parts[kMaxPeerRanks];
  parts[0] = ws + me * band_bytes;
  if (!a.split_sum || P == 2) {
    for (int j = 0; j + 1 < P; ++j) {
      err = EnqueueWaitGeq(xla_stream, flags + j, e, a.spin_wait, error);
      if (err != cudaSuccess) return err;
      parts[j + 1] = recv + j * band_bytes;
    }
    err = LaunchBandSum(xla_stream, a.dtype, parts, P, a.out, a.band_elems, error);
    if (err != cudaSuccess) return err;
    return Acknowledge(p, xla_stream, P, me, e, error);
  }
  for (int j = 0; j + 2 < P; ++j) {
    err = EnqueueWaitGeq(xla_stream, flags + j, e, a.spin_wait, error);
    if (err != cudaSuccess) return err;
    parts[j + 1] = recv + j * band_bytes;
  }
  const void* last[2] = {a.out, recv + (P - 2) * band_bytes};
  err = LaunchBandSum(xla_stream, a.dtype, parts, P - 1, a.out, a.band_elems, error);
  if (err != cudaSuccess) return err;
  err = EnqueueWaitGeq(xla_stream, flags + (P - 2), e, a.spin_wait, error);
  if (err != cudaSuccess) return err;
  // out = out + last band, elementwise in place (each element read before it is written, by the
  // same thread).
  err = LaunchBandSum(xla_stream, a.dtype, last, 2, a.out, a.band_elems, error);
  if (err != cudaSuccess) return err;
  return Acknowledge(p, xla_stream, P, me, e, error);
}

}  // namespace fo_jax
