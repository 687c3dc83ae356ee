// The all-gather's exchange (csrc/comm/ag_exchange.h) across processes, built with the system
// compiler (tests/cpu/test_ag_exchange.py): forked processes, one rank each, as the copy-engine
// all-gather would run with one process per GPU. Prints "ok <cases>" or the first failure, and
// exits non-zero on failure.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/ag_exchange.h"

using fo_jax::AgEntry;
using fo_jax::AgExchange;
using std::chrono::milliseconds;

namespace {

constexpr int kOpenMs = 10000;
const milliseconds kLong(20000);  // far longer than any case needs: a hang shows as this

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "process %d: %s\n", static_cast<int>(getpid()), what.c_str());
  std::fflush(stderr);
  _exit(1);
}

std::string Name(const char* tag) {
  return "/fo_jax_ag_check_" + std::to_string(getpid()) + "_" + tag;
}

std::unique_ptr<AgExchange> Open(const std::string& name, int P, int rank) {
  std::unique_ptr<AgExchange> ex;
  const std::string why = AgExchange::OpenShared(name, P, rank, rank == 0, kOpenMs, &ex);
  if (!why.empty()) Die("open: " + why);
  return ex;
}

AgEntry EntryOf(int rank, uint32_t e) {
  AgEntry a;
  a.epoch = e;
  a.device = rank;
  a.gathered = (uint64_t(rank) << 32) | e;
  a.flags = ~a.gathered;
  a.event = 7 * e + rank;
  for (int i = 0; i < fo_jax::kAgEventHandleBytes; ++i) a.event_handle[i] = uint8_t(rank + e + i);
  return a;
}

bool Same(const AgEntry& a, const AgEntry& b) {
  return a.epoch == b.epoch && a.device == b.device && a.gathered == b.gathered &&
         a.flags == b.flags && a.event == b.event &&
         std::memcmp(a.event_handle, b.event_handle, sizeof(a.event_handle)) == 0;
}

// One rank's calls 1..calls, as the handler and the copy thread would make them (in one
// thread, in the order the protocol allows): the ring slot, the entry, then every peer's entry
// awaited and checked and its event noted as waited on.
void Calls(AgExchange& ex, int P, int me, uint32_t first, uint32_t last) {
  for (uint32_t e = first; e <= last; ++e) {
    std::string why = ex.AwaitRingSlot(me, e, kLong);
    if (!why.empty()) Die("ring slot of call " + std::to_string(e) + ": " + why);
    why = ex.Publish(me, EntryOf(me, e));
    if (!why.empty()) Die("publish: " + why);
    ex.NoteWaited(me, me, e);
    for (int s = 1; s < P; ++s) {
      const int q = (me + s) % P;
      AgEntry got;
      why = ex.AwaitEntry(me, q, e, kLong, &got);
      if (!why.empty()) Die("entry of rank " + std::to_string(q) + ": " + why);
      if (!Same(got, EntryOf(q, e))) Die("rank " + std::to_string(q) + "'s entry differs");
      ex.NoteWaited(q, me, e);
    }
  }
}

// Runs body(rank) in P forked processes; returns their exit statuses.
template <typename F>
std::vector<int> Fork(int P, F body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < P; ++r) {
    const pid_t pid = fork();
    if (pid < 0) Die("fork failed");
    if (pid == 0) {
      alarm(60);  // a hang ends the process (SIGALRM), and the case fails
      body(r);
      _exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<int> out;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    out.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return out;
}

bool AllZero(const std::vector<int>& codes) {
  for (int c : codes) {
    if (c != 0) return false;
  }
  return true;
}

void Expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    std::exit(1);
  }
}

// A wait's failure text must name `needle` and come well before kLong.
void ExpectFailsFast(const std::string& why, const char* needle,
                     std::chrono::steady_clock::time_point since, const char* what) {
  const auto took = std::chrono::steady_clock::now() - since;
  if (why.find(needle) == std::string::npos) Die(std::string(what) + ": wrong failure: " + why);
  if (took > milliseconds(5000)) Die(std::string(what) + ": failed only after the wait's limit");
}

}  // namespace

int main() {
  int cases = 0;
  const int P = 4;

  // 200 calls (25 turns of the 8-slot ring) by 4 processes in lockstep; the name is gone
  // afterwards (the last process to map it unlinked it).
  {
    const std::string name = Name("calls");
    Expect(AllZero(Fork(P, [&](int r) {
             auto ex = Open(name, P, r);
             Calls(*ex, P, r, 1, 200);
           })),
           "200 calls across 4 processes");
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    Expect(fd < 0, "the exchange's name is removed once every process has mapped it");
    ++cases;
  }

  // A rank whose process ends between calls: every other rank's next wait for its entry fails
  // at once, naming the rank, and records that it gave up on it.
  {
    const std::string name = Name("ended");
    Expect(AllZero(Fork(P, [&](int r) {
             auto ex = Open(name, P, r);
             Calls(*ex, P, r, 1, 5);
             if (r == 2) _exit(0);  // without reaching call 6
             ex->Publish(r, EntryOf(r, 6));
             const auto since = std::chrono::steady_clock::now();
             AgEntry got;
             const std::string why = ex->AwaitEntry(r, 2, 6, kLong, &got);
             ExpectFailsFast(why, "rank 2", since, "a peer that ended");
             if (why.find("ended") == std::string::npos) Die("not said to have ended: " + why);
             if (!ex->PeerGaveUp(r, 2, 6)) Die("the wait did not record giving up on rank 2");
           })),
           "a peer's process ends between calls");
    ++cases;
  }

  // A process that ends holding the exchange's lock: the next locker fails the group (robust
  // mutex), and every rank's wait ends with that failure instead of hanging.
  {
    const std::string name = Name("locked");
    Expect(AllZero(Fork(P, [&](int r) {
             auto ex = Open(name, P, r);
             Calls(*ex, P, r, 1, 3);
             if (r == 1) {
               ex->LockForeverForTests();
               _exit(0);
             }
             const auto since = std::chrono::steady_clock::now();
             std::this_thread::sleep_for(milliseconds(200));  // rank 1 takes the lock first
             AgEntry got;
             const std::string why = ex->AwaitEntry(r, 1, 4, kLong, &got);
             ExpectFailsFast(why, "ended", since, "a process that ended holding the lock");
           })),
           "a process ends holding the lock");
    ++cases;
  }

  // A rank that stays alive but never publishes: the wait ends at its limit with the rank and
  // the call named, and the group's failure reaches the ranks that wait on others.
  {
    const std::string name = Name("timeout");
    Expect(AllZero(Fork(P, [&](int r) {
             auto ex = Open(name, P, r);
             Calls(*ex, P, r, 1, 2);
             if (r == 3) {  // alive, silent, until the others are done
               std::this_thread::sleep_for(milliseconds(1500));
               if (ex->failure().find("rank 3 did not reach all-gather call 3") ==
                   std::string::npos) {
                 Die("the group's failure: " + ex->failure());
               }
               return;
             }
             ex->Publish(r, EntryOf(r, 3));
             AgEntry got;
             const std::string why = ex->AwaitEntry(r, 3, 3, milliseconds(300), &got);
             if (why.find("rank 3 did not reach all-gather call 3") == std::string::npos) {
               Die("timeout: " + why);
             }
           })),
           "a silent rank times out");
    ++cases;
  }

  // The ring: a rank may not re-record slot e % 8 until every copy thread has waited on its
  // call e - 8; with one copy thread behind, AwaitRingSlot waits, and passes once it catches up.
  {
    const std::string name = Name("ring");
    Expect(AllZero(Fork(2, [&](int r) {
             auto ex = Open(name, 2, r);
             if (r == 0) {
               for (uint32_t e = 1; e <= 8; ++e) {
                 ex->Publish(0, EntryOf(0, e));
                 ex->NoteWaited(0, 0, e);
               }
               const auto since = std::chrono::steady_clock::now();
               const std::string why = ex->AwaitRingSlot(0, 9, kLong);  // rank 1 has waited on 1..8 only after 300 ms
               if (!why.empty()) Die("ring: " + why);
               if (std::chrono::steady_clock::now() - since < milliseconds(250)) {
                 Die("the ring slot was reused before the peer had waited on its event");
               }
             } else {
               std::this_thread::sleep_for(milliseconds(300));
               for (uint32_t e = 1; e <= 8; ++e) ex->NoteWaited(0, 1, e);
             }
           })),
           "the ring waits for the slowest copy thread");
    ++cases;
  }

  // A waiter that ends inside its wait while its process lives on (a dying process loses its
  // threads first, and a CUDA process's teardown can take seconds): the other ranks' calls go on
  // at their pace. With a process-shared condition variable the dead waiter's count stayed in
  // the table, and the second broadcast after it (rank 0's second entry, with rank 1 waiting)
  // blocked forever.
  {
    const std::string name = Name("killed_waiter");
    Expect(AllZero(Fork(3, [&](int r) {
             auto ex = Open(name, 3, r);
             if (r == 2) {
               const pid_t waiter = fork();
               if (waiter == 0) {
                 AgEntry got;
                 ex->AwaitEntry(2, 0, 1, kLong, &got);
                 _exit(0);
               }
               std::this_thread::sleep_for(milliseconds(300));
               kill(waiter, SIGKILL);
               waitpid(waiter, nullptr, 0);
               std::this_thread::sleep_for(milliseconds(3000));  // alive, and silent
               return;
             }
             std::this_thread::sleep_for(milliseconds(600));  // rank 2's waiter is gone
             const auto since = std::chrono::steady_clock::now();
             for (uint32_t e = 1; e <= 3; ++e) {
               if (r == 0) {
                 const std::string why = ex->Publish(0, EntryOf(0, e));
                 if (!why.empty()) Die("publish: " + why);
                 ex->NoteWaited(0, 0, e);
                 std::this_thread::sleep_for(milliseconds(100));
               } else {
                 AgEntry got;
                 const std::string why = ex->AwaitEntry(1, 0, e, kLong, &got);
                 if (!why.empty()) Die("entry of rank 0: " + why);
                 if (!Same(got, EntryOf(0, e))) Die("rank 0's entry differs");
                 ex->NoteWaited(0, 1, e);
               }
             }
             if (std::chrono::steady_clock::now() - since > milliseconds(2000)) {
               Die("the calls after a killed waiter were slow");
             }
           })),
           "a waiter killed inside its wait");
    ++cases;
  }

  // The take handshake (one process; the table's logic is the same shared): a rank that gives
  // up on its peers for a call after publishing it leaves the bands of a peer that took the call
  // to that peer, and a peer cannot take a call given up on. Raced: exactly one of the two owns
  // the peer's bands of each call, never both (rows landing after the call) or neither (a hang).
  {
    auto ex = AgExchange::CreateLocal(3);
    Expect(ex != nullptr, "a local exchange");
    Expect(ex->TakeEntry(0, 1, 1), "a take before the give-up");
    Expect(ex->ReleaseAllPeers(0, 1) == 0b100u, "the give-up leaves a taker's bands to it");
    Expect(!ex->TakeEntry(0, 2, 1), "no take after the give-up");
    Expect(!ex->PeerGaveUp(0, 1, 1) && ex->PeerGaveUp(0, 2, 1), "given up on the other only");
    Expect(ex->TakeEntry(0, 1, 2) && ex->TakeEntry(0, 2, 2) && ex->ReleaseAllPeers(0, 2) == 0,
           "every peer took: nothing to release");
    for (uint32_t e = 3; e < 3003; ++e) {
      std::atomic<int> ready{0};
      bool took = false;
      std::thread peer([&] {
        ready.fetch_add(1);
        while (ready.load() < 2) {
        }
        took = ex->TakeEntry(0, 1, e);
      });
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      const uint32_t given_up = ex->ReleaseAllPeers(0, e);
      peer.join();
      Expect(took != bool(given_up & 0b10u), "call " + std::to_string(e) +
                                                 ": the bands owned by both or by neither");
    }
    ++cases;
  }

  // One process: the same table in the heap, every rank a thread's role.
  {
    auto ex = AgExchange::CreateLocal(2);
    Expect(ex != nullptr, "a local exchange");
    std::thread other([&] { Calls(*ex, 2, 1, 1, 50); });
    Calls(*ex, 2, 0, 1, 50);
    other.join();
    ++cases;
  }

  std::printf("ok %d cases\n", cases);
  return 0;
}
