// The copy-engine all-gather's exchange between the ranks of a group, in one process or across
// the processes of one host (docs/design.md, "The all-gather"; issue 33). Each rank's handler
// publishes per call an entry (its gathered output, its band flags, its "call started" event);
// each rank's copy thread waits for the peer's entry before it pushes into the peer, and notes
// that it waited on the peer's event (the peer may then re-record that ring slot); a copy thread
// takes a peer's call before it writes into it, and a rank that gives up on a peer for a call
// records it unless the peer took it (the peer then writes nothing into it, or the rank's call
// waits for the peer's bands); the first failure is the group's and ends every later wait.
//
// The table is plain data guarded by a process-shared, robust pthread mutex, with a futex word
// that every change bumps and wakes, so it can live in the heap (one process) or in a POSIX
// shared-memory segment that every process of the group maps. Across processes a rank's process
// can end at any point: a wait checks the peers' processes (kill(pid, 0), /proc) after every
// kAgPollMs it has waited, not at each wake-up (a check costs tens of microseconds per peer, and
// every change wakes every waiter), so a peer that ended fails the wait within kAgPollMs instead
// of after the caller's timeout; a process that ended while holding the mutex leaves it to the
// next locker as a failure (EOWNERDEAD); and a thread that ends inside a wait leaves nothing
// behind, since a futex keeps its waiters in the kernel (a process-shared condition variable
// keeps a count of them in the shared memory, and a waiter killed there blocks a later broadcast
// forever). Linux, host-only: no CUDA here (the event travels as its IPC handle's bytes;
// ag_exchange_check.cc tests this file with the system compiler).
#pragma once

#include <pthread.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace fo_jax {

inline constexpr int kAgMaxRanks = 16;         // kMaxCopyEngineRanks (overlap_plan.h)
inline constexpr int kAgRing = 8;              // "call started" events per rank, reused in turn
inline constexpr int kAgEventHandleBytes = 64;  // sizeof(cudaIpcEventHandle_t)
inline constexpr int kAgFailureBytes = 512;
inline constexpr int kAgPollMs = 100;          // the longest a wait goes without a liveness check
static_assert(kAgMaxRanks <= 32, "ReleaseAllPeers returns the ranks as a 32-bit mask");

// What rank r published for its call `epoch`: plain data, readable in another process.
struct AgEntry {
  uint32_t epoch = 0;
  int32_t device = -1;    // the owner's CUDA ordinal (meaningful in its own process)
  uint64_t gathered = 0;  // the owner's address of this call's gathered output
  uint64_t flags = 0;     // and of its band flags
  uint64_t event = 0;     // the owner's cudaEvent_t (used as such in the owner's process only)
  unsigned char event_handle[kAgEventHandleBytes] = {};  // its CUDA IPC handle (other processes)
};

// The table (in the heap or in shared memory).
struct AgExchangeTable {
  uint64_t magic;  // set last by the creator: the rest is initialized
  int32_t nranks;
  int32_t opened;  // processes that have mapped the segment (the last one unlinks its name)
  int32_t pid[kAgMaxRanks];  // each rank's process
  pthread_mutex_t mu;
  uint32_t wakeups;  // bumped after every change under mu, and woken (a futex word)
  AgEntry entry[kAgMaxRanks][kAgRing];
  // waited[q][r]: the latest call of rank q whose event rank r's copy thread has waited on.
  uint32_t waited[kAgMaxRanks][kAgMaxRanks];
  // released[r][q]: the latest call for which rank r gave up on rank q (released q's bands
  // itself): q writes nothing into it.
  uint32_t released[kAgMaxRanks][kAgMaxRanks];
  // taken[q][r]: the latest call of rank q that rank r's copy thread took to write its bands
  // into: a later give-up of q's leaves those bands to r, and q's call waits for them.
  uint32_t taken[kAgMaxRanks][kAgMaxRanks];
  char failure[kAgFailureBytes];  // "" while healthy: set once
};

class AgExchange {
 public:
  AgExchange(const AgExchange&) = delete;
  AgExchange& operator=(const AgExchange&) = delete;
  ~AgExchange();

  // A table for ranks that all live in this process.
  static std::unique_ptr<AgExchange> CreateLocal(int nranks);

  // The table of a group whose ranks live in several processes of this host: the
  // shared-memory segment `name` ("/..." as shm_open takes it), created by the rank with
  // `create` (one per group) and opened by the others, which wait up to timeout_ms for it.
  // `rank` is this process's rank in the group (one per process: the all-gather across
  // processes runs one GPU per process). Returns "" and *out, or why not.
  static std::string OpenShared(const std::string& name, int nranks, int rank, bool create,
                                int timeout_ms, std::unique_ptr<AgExchange>* out);

  int nranks() const { return table_->nranks; }

  // Rank `rank`'s entry for its call entry.epoch (ring slot epoch % kAgRing). Returns the
  // group's failure ("" while healthy): the caller then releases its peers' bands itself.
  std::string Publish(int rank, const AgEntry& entry);

  // Waits until rank q's entry for call e is there (*out), the group fails, q's process ends,
  // or `timeout` passes; on anything but the entry, rank `me` gives up on q for call e
  // (released[me][q] = e) and the group fails. Returns "" or the failure. Even after a failure,
  // an entry that is there is returned with it (the caller releases that peer's flags).
  std::string AwaitEntry(int me, int q, uint32_t e, std::chrono::milliseconds timeout,
                         AgEntry* out);

  // Rank `me` gives up on every peer for call e that has not taken it (TakeEntry). Returns the
  // peers given up on (bit q), whose bands `me` must release itself; a peer that took the call
  // writes its bands into it (its rows, or after a failure of its own NaNs and their flags), and
  // the call must wait for them: released, its memory could be XLA's again before they land.
  uint32_t ReleaseAllPeers(int me, uint32_t e);
  // Whether rank q gave up on rank `me` for call e (then `me` writes nothing into q).
  bool PeerGaveUp(int q, int me, uint32_t e);
  // Rank me's copy thread, before it writes into rank q's call e: false if q gave up on `me`
  // for it (then `me` writes nothing into it); otherwise records that `me` writes its bands
  // into it (ReleaseAllPeers then leaves them to `me`) and returns true.
  bool TakeEntry(int q, int me, uint32_t e);
  // Rank r's copy thread has waited on rank q's event of call e.
  void NoteWaited(int q, int r, uint32_t e);
  // Before rank `me` re-records ring slot e % kAgRing: every rank's copy thread has waited on
  // its call e - kAgRing. Returns "" or the failure (the group's, or this wait's timeout).
  std::string AwaitRingSlot(int me, uint32_t e, std::chrono::milliseconds timeout);

  // The group's failure: the first one set wins; every later wait ends with it.
  void Fail(const std::string& why);
  std::string failure();

  // Test hook: takes the mutex and never releases it (a process that ends inside).
  void LockForeverForTests();

 private:
  class Lock;
  class LivenessCheck;
  AgExchange(AgExchangeTable* table, bool shared, size_t bytes)
      : table_(table), shared_(shared), bytes_(bytes) {}
  // Under the lock, after pthread_mutex_lock or _timedwait returned EOWNERDEAD: the mutex made
  // consistent again and the group failed.
  void OwnerDied();
  // Under the lock: the first peer whose process has ended, as a failure ("" if none).
  std::string DeadPeerLocked(int me);
  void FailLocked(const std::string& why);
  // Under the lock: lets go of it and sleeps until the next Notify or `until` (a wait passes
  // its next liveness check or its limit, whichever comes first), then takes it again.
  void WaitSliceLocked(std::chrono::steady_clock::time_point until);
  // After a change to the table (made under the lock): wakes every waiter.
  void Notify();

  AgExchangeTable* table_;
  bool shared_;
  size_t bytes_;
};

}  // namespace fo_jax
