// The Python extension fo_jax._fo_jax_cuda: hands the FFI handler capsules to Python, binds the
// plan's enums (their values exist only in C++: comm/overlap_plan.h) and answers the host-side
// questions the lowering needs (GEMM config table, NCCL unique ids, peer access between GPUs),
// plus what fo_jax holds and diagnostics. Python registers the capsules with
// jax.ffi.register_ffi_target (fo_jax/_cuda.py). The tests' checks and hooks are bound by
// test_bindings.cc, into the same module.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <nccl.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "comm/call_timeline.h"
#include "comm/comm_registry.h"
#include "comm/copy_engine.h"
#include "comm/copy_engine_debug.h"
#include "comm/device_memory.h"
#include "comm/group_ids.h"
#include "comm/ipc_probe.h"
#include "comm/overlap_plan.h"
#include "comm/peer_memory_ipc.h"
#include "comm/xla_pool_ipc.h"
#include "comm/status.h"
#include "ffi/registrations.h"
#include "kernels/signaling_gemm.h"
#include "test_bindings.h"

namespace nb = nanobind;

NB_MODULE(_fo_jax_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    for (const auto& [name, handler] : fo_jax::FfiHandlers()) {
      d[name.c_str()] = nb::capsule(handler);
    }
    return d;
  });
  m.def("cpu_registrations", []() {
    nb::dict d;
    for (const auto& [name, handler] : fo_jax::CpuFfiHandlers()) {
      d[name.c_str()] = nb::capsule(handler);
    }
    return d;
  });

  // The plan's enums: Python names a value, C++ owns its number (fo_jax/_cuda_ops.py).
  nb::enum_<fo_jax::Collective>(m, "Collective")
      .value("reduce_scatter", fo_jax::Collective::kReduceScatter)
      .value("all_reduce", fo_jax::Collective::kAllReduce)
      .value("all_gather", fo_jax::Collective::kAllGather);
  nb::enum_<fo_jax::Transport>(m, "Transport")
      .value("nccl", fo_jax::Transport::kNccl)
      .value("copy_engine", fo_jax::Transport::kCopyEngine);
  nb::enum_<fo_jax::SumSplit>(m, "SumSplit")
      .value("one", fo_jax::SumSplit::kOnePass)
      .value("bands", fo_jax::SumSplit::kByBands)
      .value("rows", fo_jax::SumSplit::kByRows);
  nb::enum_<fo_jax::GemmDtype>(m, "GemmDtype")
      .value("bfloat16", fo_jax::GemmDtype::kBF16)
      .value("float16", fo_jax::GemmDtype::kF16)
      .value("float8_e4m3fn", fo_jax::GemmDtype::kE4M3);

  m.def("gemm_configs", []() {
    nb::list configs;
    for (int i = 0; i < fo_jax::NumGemmConfigs(); ++i) {
      const fo_jax::GemmTileConfig& c = fo_jax::GetGemmConfig(i);
      nb::dict d;
      d["index"] = i;
      d["name"] = std::string(c.name);
      d["tile_m"] = c.tile_m;
      d["tile_n"] = c.tile_n;
      d["tile_k"] = c.tile_k;
      d["cluster_m"] = c.cluster_m;
      d["cluster_n"] = c.cluster_n;
      d["pingpong"] = c.pingpong;
      d["fast_accum"] = c.fast_accum;
      d["promotion_k_tiles"] = c.promotion_k_tiles;
      d["takes_addends"] = fo_jax::GemmConfigTakesAddends(i);
      nb::list dtypes;  // operand dtypes with kernels (fp8 rows: float8_e4m3fn only)
      for (auto [name, dtype] : {std::pair{"bfloat16", fo_jax::GemmDtype::kBF16},
                                 std::pair{"float16", fo_jax::GemmDtype::kF16},
                                 std::pair{"float8_e4m3fn", fo_jax::GemmDtype::kE4M3}}) {
        if (fo_jax::GemmConfigSupportsDtype(i, dtype)) dtypes.append(std::string(name));
      }
      d["dtypes"] = nb::tuple(dtypes);
      d["has_consumer"] = fo_jax::GemmConfigHasConsumer(i);
      configs.append(d);
    }
    return configs;
  });

  m.def(
      "select_gemm_config",
      [](fo_jax::GemmDtype dtype, int m, int n, int k, int batch, int sm_budget) {
        return fo_jax::SelectGemmConfig(dtype, m, n, k, batch, sm_budget);
      },
      nb::arg("dtype"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("batch"),
      nb::arg("sm_budget"));

  // The consumer GEMM's pick (the all-gather's) for bands of band_rows rows.
  m.def(
      "select_consumer_gemm_config",
      [](fo_jax::GemmDtype dtype, int m, int n, int k, int band_rows, int sm_budget) {
        return fo_jax::SelectConsumerGemmConfig(dtype, m, n, k, band_rows, sm_budget);
      },
      nb::arg("dtype"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("band_rows"),
      nb::arg("sm_budget"));

  m.def("max_gemm_groups", []() { return fo_jax::kMaxGemmGroups; });
  m.def("max_k_splits", []() { return fo_jax::kMaxKSplits; });

  // The progress watchdog's limit (fo_jax/_env.py, FO_JAX_COMM_TIMEOUT_S), set
  // once when Python loads the module: the module reads no environment variable.
  m.def("set_comm_timeout_s", [](double seconds) { fo_jax::SetCommTimeoutSeconds(seconds); },
        nb::arg("seconds"));

  // Known failures across processes (fo_jax/_failure_watch.py, comm/comm_registry.h): the
  // (unique id, failure) of every failed group of this process; and a group's abort after a
  // failure known here or published by another process. Without the GIL: the abort may wait up
  // to 2 s per communicator for a call that holds its lock.
  m.def("failed_groups", []() {
    std::vector<std::pair<nb::bytes, std::string>> out;
    for (const auto& [id, failure] : fo_jax::FailedGroups()) {
      out.emplace_back(nb::bytes(id.data(), id.size()), failure);
    }
    return out;
  });
  m.def(
      "abort_group_for_known_failure",
      [](nb::bytes unique_id, const std::string& failure) {
        const std::string id(unique_id.c_str(), unique_id.size());
        nb::gil_scoped_release released;
        fo_jax::AbortGroupForKnownFailure(id, failure);
      },
      nb::arg("unique_id"), nb::arg("failure"));

  // The NCCL unique id of a group token (comm/group_ids.h): registered when an overlapped call
  // is lowered (fo_jax/_bootstrap.py), read back by tests.
  m.def(
      "register_group_unique_id",
      [](nb::bytes token, nb::bytes unique_id) {
        if (token.size() != fo_jax::kGroupTokenBytes ||
            unique_id.size() != fo_jax::kGroupUniqueIdBytes) {
          throw std::invalid_argument("register_group_unique_id: a token is 32 bytes and a "
                                      "unique id 128");
        }
        fo_jax::RegisterGroupUniqueId(std::string(token.c_str(), token.size()),
                                      std::string(unique_id.c_str(), unique_id.size()));
      },
      nb::arg("token"), nb::arg("unique_id"));
  m.def(
      "group_unique_id",
      [](nb::bytes token) -> std::optional<nb::bytes> {
        if (token.size() != fo_jax::kGroupTokenBytes) {
          throw std::invalid_argument("group_unique_id: a token is 32 bytes");
        }
        char id[fo_jax::kGroupUniqueIdBytes];
        if (!fo_jax::FindGroupUniqueId(reinterpret_cast<const uint8_t*>(token.c_str()), id)) {
          return std::nullopt;
        }
        return nb::bytes(id, sizeof(id));
      },
      nb::arg("token"));

  m.def("nccl_unique_id", []() {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      throw std::runtime_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    }
    return nb::bytes(id.internal, sizeof(id.internal));
  });

  // "" when every pair of these local GPUs can access each other's memory (the copy-engine
  // transport's requirement), else why not.
  m.def("peer_access_problem",
        [](const std::vector<int>& ordinals) { return fo_jax::PeerAccessProblem(ordinals); },
        nb::arg("ordinals"));

  // What fo_jax holds outside XLA (fo_jax/info.py, device_resources): one row per communicator
  // (device, rank, ranks, group index, NCCL CTA bound, whether it has a copy-engine state and
  // that state's epoch), and one per (device, kind) of device memory (device, kind, bytes held,
  // allocations held, bytes freed so far).
  m.def("comm_resources", []() {
    std::vector<std::tuple<int, int, int, int, int, bool, uint32_t>> rows;
    for (fo_jax::CommState* s : fo_jax::AllCommStatesForDebug()) {
      rows.emplace_back(s->device, s->rank, s->nranks, fo_jax::CommGroupIndex(*s),
                        s->options.max_ctas, s->copy_engine != nullptr,
                        s->copy_engine ? s->copy_engine->epoch.load() : 0u);
    }
    return rows;
  });
  m.def("device_memory", []() {
    std::vector<std::tuple<int, std::string, size_t, int, size_t>> rows;
    for (const fo_jax::DeviceBytes& b : fo_jax::DeviceBytesHeld()) {
      rows.emplace_back(b.device, b.what, b.bytes, b.allocations, b.freed_bytes);
    }
    return rows;
  });

  // Diagnostics for a hang: the number of fo_jax communicators of this process, and one line
  // about communicator i (comm/copy_engine_debug.h), "" past the end. Without the GIL: on a hung
  // machine the CUDA calls that read the flags may block, and the caller's watchdog thread must
  // still be able to report (fo_jax/_diagnostics.py prints each line as it comes).
  m.def("debug_comm_state_count",
        []() { return static_cast<int>(fo_jax::AllCommStatesForDebug().size()); });
  m.def(
      "debug_comm_state",
      [](int i) {
        std::vector<fo_jax::CommState*> all = fo_jax::AllCommStatesForDebug();
        if (i < 0 || i >= static_cast<int>(all.size())) return std::string();
        return fo_jax::DescribeCopyEngineForDebug(*all[i]);
      },
      nb::arg("index"), nb::call_guard<nb::gil_scoped_release>());

  // Per fo_jax communicator of this process: (device, rank, copies enqueued, copy graphs built,
  // graph updates made) by the copy-engine transport (tests: the graphs are reused, not rebuilt
  // per copy; an update is skipped when a copy's operands are those of its graph already).
  m.def("copy_engine_counts", []() {
    std::vector<std::tuple<int, int, uint64_t, uint64_t, uint64_t>> rows;
    for (fo_jax::CommState* s : fo_jax::AllCommStatesForDebug()) {
      const fo_jax::CopyEngineCounts c = fo_jax::CountCopyEngineCopies(*s);
      rows.emplace_back(s->device, s->rank, c.copies, c.graphs_built, c.updates);
    }
    return rows;
  });

  // Untraced per-call timelines of the copy-engine transport (comm/call_timeline.h;
  // the timeline probe of dev/): arm every communicator for `calls` calls (0 disarms), with
  // the GPUs idle; then read one row per recorded call, times in us relative to `origin_ns` on
  // the steady clock that timeline_now_ns reads.
  m.def("timeline_now_ns", []() { return fo_jax::TimelineNowNs(); });
  m.def("timeline_marks", []() { return fo_jax::TimelineColumnNames(); });
  m.def(
      "timeline_start",
      [](int calls) {
        if (calls < 0) throw std::invalid_argument("calls must be >= 0");
        const fo_jax::Status status = fo_jax::StartCallTimelines(calls);
        if (!status.ok()) throw std::runtime_error("fo_jax timeline: " + status.message());
      },
      nb::arg("calls"), nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "timeline_read",
      [](int64_t origin_ns) {
        fo_jax::Status status;
        std::vector<fo_jax::TimelineRow> rows;
        {
          nb::gil_scoped_release release;
          status = fo_jax::ReadCallTimelines(origin_ns, &rows);
        }
        if (!status.ok()) throw std::runtime_error("fo_jax timeline: " + status.message());
        std::vector<std::tuple<int, int, int, std::vector<double>>> out;
        for (auto& r : rows) out.emplace_back(r.device, r.rank, r.call, std::move(r.us));
        return out;
      },
      nb::arg("origin_ns"));

  m.def("nccl_version", []() {
    int v = 0;
    ncclGetVersion(&v);
    return v;
  });

  // This host's identity as the copy engine's address exchange carries it.
  m.def("copy_engine_host_identity", []() { return fo_jax::HostIdentity(); });

  // The lowering's CUDA IPC probe between processes (comm/ipc_probe.h, used by
  // fo_jax/_process_layout.py): export this process's probe buffer of a GPU as (handle bytes,
  // problem), try another process's handle from a GPU ("" or why not), free the buffers.
  m.def(
      "ipc_probe_export",
      [](int device) {
        fo_jax::IpcProbeExport r;
        {
          nb::gil_scoped_release release;
          r = fo_jax::ExportIpcProbe(device);
        }
        return std::make_pair(nb::bytes(r.handle.data(), r.handle.size()), r.problem);
      },
      nb::arg("device"));
  m.def(
      "ipc_probe_try",
      [](int device, const nb::bytes& handle, int slot, uint32_t word) {
        const std::string h(handle.c_str(), handle.size());
        nb::gil_scoped_release release;
        return fo_jax::TryIpcProbe(device, h, slot, word);
      },
      nb::arg("device"), nb::arg("handle"), nb::arg("slot"), nb::arg("word"));
  m.def("ipc_probe_release", []() { fo_jax::ReleaseIpcProbes(); },
        nb::call_guard<nb::gil_scoped_release>());

  // Whether the XLA allocation holding the buffer at `ptr` (an XLA buffer of this process) can
  // be exported to peer processes, as the copy-engine all-reduce across processes exports its
  // output's (comm/xla_pool_ipc.h; fo_jax/_process_layout.py, xla_pool_problem): "" or why not.
  m.def(
      "xla_pool_export_problem",
      [](uint64_t ptr) -> std::string {
        void* p = reinterpret_cast<void*>(ptr);
        cudaPointerAttributes attr{};
        if (cudaPointerGetAttributes(&attr, p) != cudaSuccess ||
            attr.type != cudaMemoryTypeDevice) {
          (void)cudaGetLastError();
          return "not a CUDA device buffer";
        }
        int previous = 0;
        (void)cudaGetDevice(&previous);
        (void)cudaSetDevice(attr.device);
        fo_jax::PoolExport ex;
        const fo_jax::Status st = fo_jax::ExportPoolOf(p, 16, &ex);
        (void)cudaSetDevice(previous);
        return st.ok() ? std::string() : st.message();
      },
      nb::arg("ptr"), nb::call_guard<nb::gil_scoped_release>());

  fo_jax::BindTestBindings(m);
}
