// The host cost per call of the copy-engine all-gather's exchange across processes
// (csrc/comm/ag_exchange.h), without a GPU: P forked processes, one rank each, each with the two
// threads that use the exchange in a call (the handler: the ring slot, then its entry; the copy
// thread: every peer's entry awaited, taken and its event noted as waited on), and `idle` more
// threads that only sleep, as a JAX process holds hundreds (the liveness check reads each peer's
// /proc/<pid>/stat, whose cost grows with the peer's threads). Prints the wall time per call
// (calls after the first `warm`, the slowest rank) and the group's median over `rounds` runs.
//
//   c++ -std=c++17 -O2 -pthread -I csrc csrc/comm/ag_exchange.cc
//       dev/probes_host/ag_exchange_cost.cc -o /tmp/ag_exchange_cost -lrt    (one line)
//   /tmp/ag_exchange_cost [P=4] [calls=2000] [idle=400] [rounds=5]
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/ag_exchange.h"

using fo_jax::AgEntry;
using fo_jax::AgExchange;
using Clock = std::chrono::steady_clock;

namespace {

const std::chrono::milliseconds kLong(20000);
constexpr uint32_t kWarm = 50;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "process %d: %s\n", static_cast<int>(getpid()), what.c_str());
  _exit(1);
}

void Check(const std::string& why, const char* what) {
  if (!why.empty()) Die(std::string(what) + ": " + why);
}

// One rank's process: `calls` calls through the exchange; returns the microseconds per call
// after the first kWarm, or exits non-zero.
double Rank(const std::string& name, int P, int me, uint32_t calls, int idle) {
  std::mutex idle_mu;
  std::condition_variable idle_cv;
  bool done = false;
  std::vector<std::thread> sleepers;
  for (int i = 0; i < idle; ++i) {
    sleepers.emplace_back([&] {
      std::unique_lock<std::mutex> lock(idle_mu);
      idle_cv.wait(lock, [&] { return done; });
    });
  }
  std::unique_ptr<AgExchange> ex;
  Check(AgExchange::OpenShared(name, P, me, me == 0, 10000, &ex), "open");

  // The handler hands each published call to the copy thread, as it pushes the copy job (a
  // queue under a mutex and a condition variable, as csrc/comm/host_worker.h's).
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  uint32_t published = 0;
  Clock::time_point start;
  std::thread copier([&] {
    for (uint32_t e = 1; e <= calls; ++e) {
      {
        std::unique_lock<std::mutex> lock(queue_mu);
        queue_cv.wait(lock, [&] { return published >= e; });
      }
      ex->NoteWaited(me, me, e);
      for (int s = 1; s < P; ++s) {
        const int q = (me + s) % P;
        AgEntry got;
        Check(ex->AwaitEntry(me, q, e, kLong, &got), "entry");
        if (got.epoch != e) Die("wrong entry");
        if (!ex->TakeEntry(q, me, e)) Die("a peer gave up");
        ex->NoteWaited(q, me, e);
      }
    }
  });
  for (uint32_t e = 1; e <= calls; ++e) {
    if (e == kWarm + 1) start = Clock::now();
    Check(ex->AwaitRingSlot(me, e, kLong), "ring slot");
    AgEntry entry;
    entry.epoch = e;
    entry.device = me;
    Check(ex->Publish(me, entry), "publish");
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      published = e;
    }
    queue_cv.notify_one();
  }
  copier.join();
  const double us =
      std::chrono::duration<double, std::micro>(Clock::now() - start).count() / (calls - kWarm);
  {
    std::lock_guard<std::mutex> lock(idle_mu);
    done = true;
  }
  idle_cv.notify_all();
  for (auto& t : sleepers) t.join();
  return us;
}

// One run: P processes; the slowest rank's microseconds per call.
double Run(int P, uint32_t calls, int idle, int round) {
  const std::string name = "/fo_jax_ag_cost_" + std::to_string(getpid()) + "_" +
                           std::to_string(round);
  auto* result = static_cast<double*>(mmap(nullptr, sizeof(double) * P, PROT_READ | PROT_WRITE,
                                           MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::vector<pid_t> pids;
  for (int r = 0; r < P; ++r) {
    const pid_t pid = fork();
    if (pid < 0) Die("fork failed");
    if (pid == 0) {
      alarm(300);
      result[r] = Rank(name, P, r, calls, idle);
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("a rank failed");
  }
  const double slowest = *std::max_element(result, result + P);
  munmap(result, sizeof(double) * P);
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  const int P = argc > 1 ? std::atoi(argv[1]) : 4;
  const uint32_t calls = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 2000;
  const int idle = argc > 3 ? std::atoi(argv[3]) : 400;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  if (P < 2 || P > fo_jax::kAgMaxRanks || calls <= kWarm || idle < 0 || rounds < 1) {
    std::fprintf(stderr, "usage: %s [P=4] [calls=2000] [idle=400] [rounds=5]\n", argv[0]);
    return 2;
  }
  std::vector<double> us;
  for (int i = 0; i < rounds; ++i) us.push_back(Run(P, calls, idle, i));
  std::vector<double> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  std::printf("P=%d calls=%u idle threads=%d: median %.1f us per call (rounds:", P, calls, idle,
              sorted[sorted.size() / 2]);
  for (double u : us) std::printf(" %.1f", u);
  std::printf(")\n");
  return 0;
}
