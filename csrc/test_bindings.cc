// See test_bindings.h.
#include "test_bindings.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

#include "comm/all_gather_check.h"
#include "comm/comm_registry.h"
#include "comm/consumer_gemm_check.h"
#include "comm/copy_engine.h"
#include "comm/copy_engine_buffers.h"
#include "comm/failed_call.h"
#include "comm/failed_nccl_call_check.h"
#include "comm/gated_collectives.h"
#include "comm/gemm_plan.h"
#include "comm/group_counters.h"
#include "comm/group_counters_check.h"
#include "comm/host_worker.h"
#include "comm/overlap_plan.h"
#include "comm/peer_memory_ipc.h"
#include "comm/status.h"
#include "comm/stuck_release_check.h"
#include "comm/stuck_ring_release_check.h"
#include "comm/test_failures.h"
#include "comm/xla_pool_ipc.h"
#include "kernels/epoch_compare.h"
#include "kernels/signaling_gemm.h"

namespace nb = nanobind;

namespace {

// The dtype a GPU check takes by name ("bfloat16", "float16" or "float8_e4m3fn"); `fn` names the
// check in the error.
fo_jax::GemmDtype CheckDtype(const char* fn, const std::string& dtype) {
  if (dtype == "bfloat16") return fo_jax::GemmDtype::kBF16;
  if (dtype == "float16") return fo_jax::GemmDtype::kF16;
  if (dtype == "float8_e4m3fn") return fo_jax::GemmDtype::kE4M3;
  throw std::invalid_argument(std::string(fn) + ": dtype must be \"bfloat16\", \"float16\" or "
                              "\"float8_e4m3fn\", got \"" + dtype + "\"");
}

// A release of a stuck call by name, for the release checks; `fn` names the check in the error.
fo_jax::ReleaseBy ReleaseByName(const char* fn, const std::string& release) {
  if (release == "watchdog") return fo_jax::ReleaseBy::kWatchdog;
  if (release == "failed_peer") return fo_jax::ReleaseBy::kFailedPeer;
  if (release == "healthy_peer") return fo_jax::ReleaseBy::kHealthyPeer;
  throw std::invalid_argument(std::string(fn) + ": release must be \"watchdog\", "
                              "\"failed_peer\" or \"healthy_peer\", got \"" + release + "\"");
}

// The fields every release check reports, as the start of its result dict.
nb::dict OutcomeDict(const fo_jax::StuckCheckOutcome& r) {
  nb::dict d;
  d["stuck_before"] = r.stuck_before;
  d["released"] = r.released;
  d["release_ms"] = r.release_ms;
  d["words_released"] = r.words_released;
  d["error"] = r.error;
  return d;
}

// The index of the GEMM config named `config`; -1 for "" (the check picks one).
int ConfigIndexByName(const char* fn, const std::string& config) {
  if (config.empty()) return -1;
  const int index = fo_jax::FindGemmConfig(config.c_str());
  if (index >= 0) return index;
  throw std::invalid_argument(std::string(fn) + ": no GEMM config named " + config);
}

// A PeerInfo (comm/peer_memory_ipc.h) from a dict of its fields, for the tests of the copy
// engine's address exchange (fake handles: bytes of cudaIpcMemHandle_t's size).
fo_jax::PeerInfo PeerInfoFromDict(const nb::dict& d) {
  fo_jax::PeerInfo info{};
  auto get_u64 = [&](const char* key) {
    return d.contains(key) ? nb::cast<uint64_t>(d[key]) : uint64_t{0};
  };
  auto get_i32 = [&](const char* key) {
    return d.contains(key) ? nb::cast<int32_t>(d[key]) : int32_t{0};
  };
  auto get_bytes = [&](const char* key, void* into, size_t size) {
    if (!d.contains(key)) return;
    nb::bytes b = nb::cast<nb::bytes>(d[key]);
    if (b.size() > size) {
      throw std::invalid_argument(std::string("PeerInfo.") + key + ": at most " +
                                  std::to_string(size) + " bytes");
    }
    std::memcpy(into, b.c_str(), b.size());
  };
  info.recv = get_u64("recv");
  info.flags = get_u64("flags");
  info.recv_bytes = get_u64("recv_bytes");
  info.host = get_u64("host");
  info.pid = get_i32("pid");
  info.device = get_i32("device");
  info.exported = get_i32("exported");
  get_bytes("bus_id", info.bus_id, fo_jax::kBusIdBytes);
  get_bytes("recv_handle", &info.recv_handle, sizeof(info.recv_handle));
  get_bytes("flags_handle", &info.flags_handle, sizeof(info.flags_handle));
  return info;
}

nb::dict PeerInfoToDict(const fo_jax::PeerInfo& info) {
  nb::dict d;
  d["recv"] = info.recv;
  d["flags"] = info.flags;
  d["recv_bytes"] = info.recv_bytes;
  d["host"] = info.host;
  d["pid"] = info.pid;
  d["device"] = info.device;
  d["exported"] = info.exported;
  d["bus_id"] = nb::bytes(info.bus_id, strnlen(info.bus_id, fo_jax::kBusIdBytes));
  d["recv_handle"] = nb::bytes(reinterpret_cast<const char*>(&info.recv_handle),
                               sizeof(info.recv_handle));
  d["flags_handle"] = nb::bytes(reinterpret_cast<const char*>(&info.flags_handle),
                                sizeof(info.flags_handle));
  return d;
}

}  // namespace

namespace fo_jax {

void BindTestBindings(nb::module_& m) {
  // Tests: the copy-engine all-gather's data path on one GPU playing the receiving rank
  // (comm/all_gather_check.h says what each option and result means). config: a config name,
  // "" for the consumer pick. Bad options come back in "error".
  m.def(
      "all_gather_copy_check",
      [](int ranks, int rank, int rows, int n, int k, int bands_per_rank,
         const std::string& dtype, const std::string& config, int sm_budget, int calls,
         int delay_us, uint64_t seed, double timeout_s, int released_sender) {
        fo_jax::AllGatherCheckOptions o;
        o.dtype = CheckDtype("all_gather_copy_check", dtype);
        o.config = ConfigIndexByName("all_gather_copy_check", config);
        o.ranks = ranks;
        o.rank = rank;
        o.rows = rows;
        o.n = n;
        o.k = k;
        o.bands_per_rank = bands_per_rank;
        o.sm_budget = sm_budget;
        o.calls = calls;
        o.delay_us = delay_us;
        o.seed = seed;
        o.timeout_s = timeout_s;
        o.released_sender = released_sender;
        fo_jax::AllGatherCheckResult r;
        {
          nb::gil_scoped_release release;
          r = fo_jax::RunAllGatherCheck(o);
        }
        nb::dict d;
        d["gathered_equal"] = r.gathered_equal;
        d["product_equal"] = r.product_equal;
        d["mismatches"] = r.mismatches;
        d["released_gathered_nan"] = r.released_gathered_nan;
        d["released_product_nan"] = r.released_product_nan;
        d["timed_out"] = r.timed_out;
        d["config"] = r.config >= 0 ? std::string(fo_jax::GetGemmConfig(r.config).name) : "";
        d["error"] = r.error;
        return d;
      },
      nb::arg("ranks"), nb::arg("rank"), nb::arg("rows"), nb::arg("n"), nb::arg("k"),
      nb::arg("bands_per_rank") = 1, nb::arg("dtype") = "bfloat16", nb::arg("config") = "",
      nb::arg("sm_budget") = 0, nb::arg("calls") = 3, nb::arg("delay_us") = 200,
      nb::arg("seed") = 0, nb::arg("timeout_s") = 60.0, nb::arg("released_sender") = -1);

  // Tests: the consumer GEMM's band visit order on rank `rank` of an all-gather over axis_size
  // ranks whose rows are sent in bands_per_rank bands (OverlapGemmArgs, comm/overlap_plan.h).
  m.def(
      "all_gather_band_order",
      [](int axis_size, int bands_per_rank, int rank) {
        if (axis_size < 1 || bands_per_rank < 1 || rank < 0 || rank >= axis_size ||
            axis_size * bands_per_rank > fo_jax::kMaxGemmBands) {
          throw std::invalid_argument("all_gather_band_order: bad axis_size, bands_per_rank or "
                                      "rank");
        }
        fo_jax::OverlapPlan plan;
        plan.collective = fo_jax::Collective::kAllGather;
        plan.axis_size = axis_size;
        plan.tiles_chunk = 1;
        fo_jax::OverlapShape shape;
        shape.m = int64_t(axis_size) * bands_per_rank *
                  fo_jax::GetGemmConfig(plan.gemm.config).tile_m;
        shape.n = shape.k = 128;
        const fo_jax::SignalingGemmArgs args = fo_jax::OverlapGemmArgs(plan, shape, rank);
        return std::vector<int>(args.band_order, args.band_order + axis_size * bands_per_rank);
      },
      nb::arg("axis_size"), nb::arg("bands_per_rank"), nb::arg("rank"));

  // Tests only: make the fo_jax communicator of rank `rank` (every rank if < 0) report `code` (an
  // ncclResult_t) as an asynchronous NCCL error, with `broken` as unusable too; 0 stops it and
  // clears the groups' failures (comm/comm_registry.h).
  m.def("inject_async_error_for_tests",
        [](int code, int rank, bool broken) {
          fo_jax::InjectAsyncErrorForTests(code, rank, broken);
        },
        nb::arg("code"), nb::arg("rank") = -1, nb::arg("broken") = false);

  // The flags' wrap-safe comparison (kernels/epoch_compare.h), the one every wait uses.
  m.def(
      "epoch_reached",
      [](uint32_t seen, uint32_t value) { return fo_jax::EpochReached(seen, value); },
      nb::arg("seen"), nb::arg("value"));

  // Tests: the copy thread's signals across the epoch wrap (comm/host_worker.h). A worker whose
  // signal starts at `first_signal` runs a job that awaits first_signal + 1 (mod 2^32); returns
  // whether the job had finished before that signal (it must not have) and after it.
  m.def(
      "host_worker_wrap_check",
      [](uint32_t first_signal) {
        fo_jax::HostWorker worker(/*device=*/0, first_signal);
        std::atomic<bool> done{false};
        const uint32_t next = first_signal + 1;
        worker.Push([&] {
          worker.AwaitSignal(next);
          done = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const bool before = done.load();
        worker.Signal(next);
        worker.Drain();
        return std::make_pair(before, done.load());
      },
      nb::arg("first_signal"), nb::call_guard<nb::gil_scoped_release>());

  // Test hooks, from FO_JAX_TEST_EPOCH_START and FO_JAX_TEST_FAIL (fo_jax/_env.py): the epoch
  // start of copy-engine states created afterwards; a stage ("alloc", comm/test_failures.h's
  // "graph", "launch", "copy", "setup", "stop", or "" for none) failing on a rank.
  m.def(
      "set_test_hooks",
      [](uint32_t epoch_start, const std::string& fail_stage, int fail_rank) {
        fo_jax::FailStage stage = fo_jax::FailStage::kNone;
        if (fail_stage != "alloc" && !fo_jax::FailStageFromName(fail_stage, &stage)) {
          throw std::invalid_argument("set_test_hooks: unknown stage \"" + fail_stage + "\"");
        }
        fo_jax::SetTestEpochStartForTests(epoch_start);
        fo_jax::SetFailReceiveAllocForTests(fail_stage == "alloc" ? fail_rank : -1);
        fo_jax::SetTestFailureForTests(stage, fail_rank);
      },
      nb::arg("epoch_start"), nb::arg("fail_stage"), nb::arg("fail_rank"));

  // Tests (no GPU): the counter values a communicator's reduce-scatter calls wait for
  // (comm/group_counters.h, as the NCCL transport's CollectiveSpans adds the base), one call
  // after another on one GroupCounters. Every call is GEMM x[rows, k] @ w[k, n] on `config` with
  // `batch`; `calls`: (group_begin, succeeded) per call. start_total >= 0: the counters start as
  // if earlier calls had left every word at that value (a wrap test), else as a new
  // communicator's. Returns (zeroes first, [expected value per group]) per call.
  m.def(
      "group_counter_waits",
      [](const std::string& config, int64_t rows, int64_t n, int64_t k, int batch,
         const std::vector<std::pair<std::vector<int>, bool>>& calls, int64_t start_total) {
        fo_jax::GroupCounters counters;
        if (start_total >= 0) {
          std::fill(counters.total, counters.total + fo_jax::kMaxGemmGroups,
                    static_cast<uint32_t>(start_total));
          counters.zero_next = false;
        }
        std::vector<std::pair<bool, std::vector<uint32_t>>> out;
        for (const auto& [group_begin, succeeded] : calls) {
          fo_jax::GemmPlan plan;
          plan.config = ConfigIndexByName("group_counter_waits", config);
          plan.batch = batch;
          plan.num_groups = static_cast<int>(group_begin.size()) - 1;
          if (plan.num_groups < 1 || plan.num_groups > fo_jax::kMaxGemmGroups) {
            throw std::invalid_argument("group_counter_waits: 2 to kMaxGemmGroups + 1 group "
                                        "boundaries per call");
          }
          std::copy(group_begin.begin(), group_begin.end(), plan.group_begin);
          const fo_jax::Status valid = fo_jax::ValidateGemmPlan(plan, rows, n, k);
          if (!valid.ok()) throw std::invalid_argument("group_counter_waits: " + valid.message());
          const fo_jax::SignalingGemmArgs gemm =
              fo_jax::GemmArgsOf(plan, fo_jax::GemmDtype::kBF16, rows, n, k);
          const bool zero = fo_jax::BeginCountedCall(counters);
          std::vector<uint32_t> expected;
          for (const fo_jax::GroupSpan& s : fo_jax::CollectiveSpans(
                   gemm, fo_jax::Collective::kReduceScatter, counters.total)) {
            expected.push_back(s.expected);
          }
          out.emplace_back(zero, expected);
          fo_jax::EndCountedCall(counters, gemm, succeeded);
        }
        return out;
      },
      nb::arg("config"), nb::arg("rows"), nb::arg("n"), nb::arg("k"), nb::arg("batch"),
      nb::arg("calls"), nb::arg("start_total") = -1);

  // Tests: the words a failed copy-engine call releases in its peers' flags
  // (comm/failed_call.h, FailedCallReleases), as (peer, field, index) in writing order, for
  // rank `rank` of `axis_size` with these arguments; `chunk_first_group`: the first group of
  // each logical chunk, then the group count (CopyEngineArgs); `part`: "call", "copy" or "xla".
  m.def(
      "failed_call_releases",
      [](int axis_size, int rank, bool all_reduce, bool ring, fo_jax::SumSplit sum_split,
         int rounds, const std::vector<int>& chunk_first_group, const std::string& part) {
        if (axis_size < 2 || axis_size > fo_jax::kMaxCopyEngineRanks || rank < 0 ||
            rank >= axis_size || rounds < 1 ||
            chunk_first_group.size() != static_cast<size_t>(rounds * axis_size + 1) ||
            rounds * (axis_size - 1) > fo_jax::kMaxReceiveSlots ||
            chunk_first_group.back() > fo_jax::kMaxGemmGroups) {
          throw std::invalid_argument("failed_call_releases: bad axis_size, rank, rounds or "
                                      "chunk_first_group");
        }
        const fo_jax::FailedPart which =
            part == "call" ? fo_jax::FailedPart::kWholeCall
            : part == "copy" ? fo_jax::FailedPart::kCopyStream
            : part == "xla" ? fo_jax::FailedPart::kXlaStream
                            : throw std::invalid_argument("failed_call_releases: part must be "
                                                          "call, copy or xla");
        fo_jax::CopyEngineArgs a;
        a.all_reduce = all_reduce;
        a.ring = ring;
        a.sum_split = sum_split;
        a.rounds = rounds;
        std::copy(chunk_first_group.begin(), chunk_first_group.end(), a.chunk_first_group);
        a.num_groups = chunk_first_group.back();
        static const char* const kNames[] = {"out_ready", "arrived", "last_pieces",
                                             "ring_arrived", "stored", "recv_acked"};
        std::vector<std::tuple<int, std::string, int>> out;
        for (const fo_jax::FlagRelease& r : fo_jax::FailedCallReleases(a, axis_size, rank, which)) {
          out.emplace_back(r.peer, kNames[static_cast<int>(r.word)], r.index);
        }
        return out;
      },
      nb::arg("axis_size"), nb::arg("rank"), nb::arg("all_reduce"), nb::arg("ring"),
      nb::arg("sum_split"), nb::arg("rounds"), nb::arg("chunk_first_group"), nb::arg("part"));

  // Tests (one GPU): the overlap handler's capture guard (comm/status.h, RejectStreamCapture) on
  // a stream of the current device that is being captured; returns its message ("" if it let
  // the capture pass).
  m.def(
      "capture_guard_message",
      []() {
        cudaStream_t stream = nullptr;
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
          throw std::runtime_error("capture_guard_message: cudaStreamCreate failed");
        }
        std::string message = "capture_guard_message: cudaStreamBeginCapture failed";
        if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
          message = fo_jax::RejectStreamCapture(stream, "fo_jax.overlapped_matmul").message();
          cudaGraph_t graph = nullptr;
          if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr) {
            (void)cudaGraphDestroy(graph);
          }
        }
        (void)cudaStreamDestroy(stream);
        (void)cudaGetLastError();
        return message;
      },
      nb::call_guard<nb::gil_scoped_release>());

  // Tests (one GPU): the releases of a stuck copy-engine call (comm/stuck_release_check.h):
  // `release` "watchdog" (the progress watchdog's), "failed_peer" (a peer's failed call's) or
  // "healthy_peer" (the control).
  m.def(
      "stuck_release_check",
      [](uint32_t epoch_start, const std::string& release, int elements, double timeout_s) {
        const fo_jax::ReleaseBy by = ReleaseByName("stuck_release_check", release);
        fo_jax::StuckReleaseCheckResult r;
        {
          nb::gil_scoped_release unlocked;
          r = fo_jax::RunStuckReleaseCheck(epoch_start, by, elements, timeout_s);
        }
        nb::dict d = OutcomeDict(r);
        d["sum_equal"] = r.sum_equal;
        d["out_poisoned"] = r.out_poisoned;
        d["canary_untouched"] = r.canary_untouched;
        return d;
      },
      nb::arg("epoch_start") = 0, nb::arg("release") = "watchdog",
      nb::arg("elements") = 1 << 20, nb::arg("timeout_s") = 10.0);

  // Tests (one GPU): the same releases of a stuck ring GEMM (comm/stuck_ring_release_check.h).
  m.def(
      "stuck_ring_release_check",
      [](uint32_t epoch_start, const std::string& release, const std::string& dtype,
         double timeout_s) {
        const fo_jax::ReleaseBy by = ReleaseByName("stuck_ring_release_check", release);
        const fo_jax::GemmDtype gemm_dtype = CheckDtype("stuck_ring_release_check", dtype);
        fo_jax::StuckRingReleaseCheckResult r;
        {
          nb::gil_scoped_release unlocked;
          r = fo_jax::RunStuckRingReleaseCheck(epoch_start, by, gemm_dtype, timeout_s);
        }
        nb::dict d = OutcomeDict(r);
        d["first_step_exact"] = r.first_step_exact;
        d["sums_exact"] = r.sums_exact;
        d["sums_poisoned"] = r.sums_poisoned;
        return d;
      },
      nb::arg("epoch_start") = 0, nb::arg("release") = "watchdog",
      nb::arg("dtype") = "bfloat16", nb::arg("timeout_s") = 10.0);

  // Tests (one GPU): the NCCL transport's call whose GEMM launch failed, on a one-rank
  // communicator of its own (comm/failed_nccl_call_check.h). collective: "reduce_scatter" or
  // "all_reduce"; dtype: the output's, "bfloat16" or "float16".
  m.def(
      "failed_nccl_call_check",
      [](fo_jax::Collective collective, const std::string& dtype) {
        const fo_jax::GemmDtype out_dtype = CheckDtype("failed_nccl_call_check", dtype);
        fo_jax::FailedNcclCallCheckResult r;
        {
          nb::gil_scoped_release unlocked;
          r = fo_jax::RunFailedNcclCallCheck(collective, out_dtype);
        }
        nb::dict d;
        d["out_all_nan"] = r.out_all_nan;
        d["guard_intact"] = r.guard_intact;
        d["counters_set"] = r.counters_set;
        d["message"] = r.message;
        d["error"] = r.error;
        return d;
      },
      nb::arg("collective"), nb::arg("dtype") = "bfloat16");

  // Tests (one GPU): the communicator's GEMM group counters across real NCCL-transport calls on a
  // one-rank communicator of the check's own (comm/group_counters_check.h says what each option
  // and result means). calls: (group_begin, fail_launch) per call. Bad options raise ValueError.
  m.def(
      "group_counters_check",
      [](fo_jax::Collective collective, const std::string& config, int64_t m, int64_t n,
         int64_t k, const std::vector<std::pair<std::vector<int>, bool>>& calls,
         uint32_t garbage, int64_t start_total, double timeout_s) {
        std::vector<fo_jax::GroupCountersCheckCall> checked;
        for (const auto& [group_begin, fail_launch] : calls) {
          checked.push_back({group_begin, fail_launch});
        }
        const int index = ConfigIndexByName("group_counters_check", config);
        if (index < 0) throw std::invalid_argument("group_counters_check: name a config");
        fo_jax::GroupCountersCheckResult r;
        {
          nb::gil_scoped_release unlocked;
          r = fo_jax::RunGroupCountersCheck(collective, index, m, n, k, checked, garbage,
                                            start_total, timeout_s);
        }
        nb::list steps;
        for (const fo_jax::GroupCountersCheckStep& s : r.steps) {
          nb::dict d;
          d["zeroed"] = s.zeroed;
          d["ok"] = s.ok;
          d["message"] = s.message;
          d["out_equal"] = s.out_equal;
          d["words"] = s.words;
          d["totals"] = s.totals;
          steps.append(d);
        }
        nb::dict d;
        d["steps"] = steps;
        d["error"] = r.error;
        return d;
      },
      nb::arg("collective"), nb::arg("config"), nb::arg("m"), nb::arg("n"), nb::arg("k"),
      nb::arg("calls"), nb::arg("garbage") = 0xDEADBEEFu, nb::arg("start_total") = -1,
      nb::arg("timeout_s") = 30.0);

  // Tests and benchmarks: the consumer GEMM on one GPU with A's bands arriving while it runs,
  // against the plain GEMM (comm/consumer_gemm_check.h says what each option and result means).
  // config: a config name, "" for the consumer heuristic. Bad options raise ValueError.
  m.def(
      "consumer_gemm_check",
      [](int m_local, int n, int k, int bands, const std::string& dtype, const std::string& order,
         int delay_us, const std::string& config, uint64_t seed, int rank, int groups_per_band,
         uint32_t flag_value, uint32_t stale_value, const std::string& staging, int sm_budget,
         int timing_iters, double timeout_s, int device) {
        fo_jax::ConsumerGemmCheckOptions o;
        o.m_local = m_local, o.n = n, o.k = k, o.bands = bands;
        o.dtype = CheckDtype("consumer_gemm_check", dtype);
        o.config = ConfigIndexByName("consumer_gemm_check", config);
        o.order = order, o.seed = seed, o.delay_us = delay_us, o.rank = rank;
        o.groups_per_band = groups_per_band, o.flag_value = flag_value;
        o.stale_value = stale_value, o.staging = staging, o.sm_budget = sm_budget;
        o.timing_iters = timing_iters, o.timeout_s = timeout_s, o.device = device;
        fo_jax::ConsumerGemmCheckResult r;
        std::string err;
        cudaError_t e;
        {
          nb::gil_scoped_release release;
          e = fo_jax::RunConsumerGemmCheck(o, &r, &err);
        }
        if (e == cudaErrorInvalidValue) throw std::invalid_argument(err);
        if (e != cudaSuccess) throw std::runtime_error(err);
        nb::dict d;
        d["config"] = r.config;
        d["visit_order"] = r.visit_order;
        d["arrival_order"] = r.arrival_order;
        d["mismatches"] = r.mismatches;
        d["band_mismatches"] = r.band_mismatches;
        d["first_bad_row"] = r.first_bad_row;
        d["max_abs_diff"] = r.max_abs_diff;
        d["reference_nonfinite"] = r.reference_nonfinite;
        d["counter_problem"] = r.counter_problem;
        d["timed_out"] = r.timed_out;
        d["wait_run_us"] = r.wait_run_us;
        d["end_after_last_flag_us"] = r.end_after_last_flag_us;
        d["plain_us"] = r.plain_us;
        d["consumer_us"] = r.consumer_us;
        return d;
      },
      nb::arg("m_local"), nb::arg("n"), nb::arg("k"), nb::arg("bands") = 4,
      nb::arg("dtype") = "bfloat16", nb::arg("order") = "forward", nb::arg("delay_us") = 0,
      nb::arg("config") = "", nb::arg("seed") = 0, nb::arg("rank") = 0,
      nb::arg("groups_per_band") = 1, nb::arg("flag_value") = 1, nb::arg("stale_value") = 0,
      nb::arg("staging") = "host", nb::arg("sm_budget") = 0, nb::arg("timing_iters") = 0,
      nb::arg("timeout_s") = 60.0, nb::arg("device") = 0);

  // Tests of the copy engine's address exchange across processes (comm/peer_memory_ipc.h):
  // a PeerInfo packed from a dict, moved as raw bytes (as the all-gather moves it) and unpacked.
  m.def(
      "copy_engine_peer_info_roundtrip",
      [](const nb::dict& fields) {
        const fo_jax::PeerInfo info = PeerInfoFromDict(fields);
        std::string wire(sizeof(fo_jax::PeerInfo), '\0');
        std::memcpy(wire.data(), &info, sizeof(info));
        fo_jax::PeerInfo back{};
        std::memcpy(&back, wire.data(), sizeof(back));
        nb::dict d = PeerInfoToDict(back);
        d["wire_bytes"] = sizeof(fo_jax::PeerInfo);
        return d;
      },
      nb::arg("fields"));

  // DecidePeerRoute: ("direct" | "ipc" | "refused", problem) for a peer entry seen from `mine`.
  m.def(
      "copy_engine_peer_route",
      [](const nb::dict& mine, const nb::dict& peer, int peer_rank, int peer_ordinal_here,
         bool can_access) {
        const fo_jax::PeerRouteDecision d = fo_jax::DecidePeerRoute(
            PeerInfoFromDict(mine), PeerInfoFromDict(peer), peer_rank, peer_ordinal_here,
            can_access);
        const char* route = d.route == fo_jax::PeerRoute::kDirect ? "direct"
                            : d.route == fo_jax::PeerRoute::kIpc  ? "ipc"
                                                                  : "refused";
        return std::make_pair(std::string(route), d.problem);
      },
      nb::arg("mine"), nb::arg("peer"), nb::arg("peer_rank"), nb::arg("peer_ordinal_here"),
      nb::arg("can_access"));

  // The all-reduce's descriptor hand-over across processes (comm/xla_pool_ipc.h), within this
  // process and without a GPU: a server hands a pipe's write end to `clients` expected
  // receivers of which `connecting` connect (each on a thread of its own); each writes its index
  // through the descriptor it received. Returns (server's problem, [each receiver's problem],
  // the bytes read back from the pipe, sorted).
  m.def(
      "fd_handover_check",
      [](int clients, int connecting, int timeout_ms) {
        int pipe_fds[2] = {-1, -1};
        if (pipe(pipe_fds) != 0) throw std::runtime_error("pipe() failed");
        fo_jax::FdServer server;
        std::string name;
        fo_jax::Status listened = server.Listen(&name);
        std::string served;
        std::vector<std::string> received(connecting);
        {
          nb::gil_scoped_release release;
          if (listened.ok()) {
            std::thread serve([&] {
              served = server.Serve(pipe_fds[1], clients, timeout_ms).message();
            });
            std::vector<std::thread> receivers;
            for (int i = 0; i < connecting; ++i) {
              receivers.emplace_back([&, i] {
                int fd = -1;
                const fo_jax::Status got = fo_jax::ReceiveFd(name, timeout_ms, &fd);
                received[i] = got.message();
                if (got.ok()) {
                  const char byte = static_cast<char>('a' + i);
                  if (write(fd, &byte, 1) != 1) received[i] = "write through it failed";
                  close(fd);
                }
              });
            }
            for (auto& t : receivers) t.join();
            serve.join();
          } else {
            served = listened.message();
          }
        }
        close(pipe_fds[1]);
        std::string bytes;
        char buf[64];
        ssize_t n;
        while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) bytes.append(buf, size_t(n));
        close(pipe_fds[0]);
        std::sort(bytes.begin(), bytes.end());
        return std::make_tuple(served, received, bytes);
      },
      nb::arg("clients"), nb::arg("connecting"), nb::arg("timeout_ms"));

  // What suffices for a split-K launch (flag words, partial floats) of config `config` on a
  // device of `sms` SMs: what fo_jax/_plan.py sizes the custom call's results by (tests compare
  // the two).
  m.def(
      "split_k_sizes",
      [](int config, int m, int n, int k, int batch, int k_splits, int sm_budget, int sms) {
        SignalingGemmArgs args;
        args.config = config;
        args.m = m;
        args.n = n;
        args.k = k;
        args.batch = batch;
        args.k_splits = k_splits;
        args.sm_budget = sm_budget;
        return std::make_pair(SplitKFlagWords(args, sms),
                              SplitKPartialFloats(args, sms));
      },
      nb::arg("config"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("batch"),
      nb::arg("k_splits"), nb::arg("sm_budget"), nb::arg("sms"));
}

}  // namespace fo_jax
