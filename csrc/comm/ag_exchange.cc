// See ag_exchange.h.
#include "comm/ag_exchange.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

namespace fo_jax {
namespace {

constexpr uint64_t kMagic = 0x666f6a61785f6167ull;  // "fojax_ag"

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

// Process-shared, robust mutex (the futex word needs no setup: zero).
std::string InitPrimitives(AgExchangeTable* t) {
  pthread_mutexattr_t ma;
  if (pthread_mutexattr_init(&ma) != 0) return "initializing the exchange's lock attributes failed";
  const bool ok = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED) == 0 &&
                  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST) == 0 &&
                  pthread_mutex_init(&t->mu, &ma) == 0;
  pthread_mutexattr_destroy(&ma);
  return ok ? "" : "initializing the exchange's process-shared lock failed";
}

// Not FUTEX_PRIVATE: the word may be shared between processes (keyed by the mapped page then).
void FutexWait(uint32_t* word, uint32_t seen, std::chrono::nanoseconds timeout) {
  const int64_t ns = std::max<int64_t>(0, timeout.count());
  timespec relative{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &relative, nullptr, 0);  // woken, timed out or
                                                                    // the word moved: all alike
}

void FutexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void InitTable(AgExchangeTable* t, int nranks) {
  std::memset(static_cast<void*>(t), 0, sizeof(*t));
  t->nranks = nranks;
  for (auto& row : t->entry) {
    for (AgEntry& e : row) e = AgEntry{};
  }
}

// "2.5 s": a wait's limit as the peers' timeout messages write it.
std::string Seconds(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", t.count() / 1000.0);
  return text;
}

// Whether process `pid` still runs: gone, or a zombie its parent has not reaped yet (a launcher
// that waits for its children in order reaps a failed one late), is not.
bool Alive(int pid) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;  // no /proc: kill's answer stands
  char text[512];
  const size_t n = std::fread(text, 1, sizeof(text) - 1, f);
  std::fclose(f);
  text[n] = '\0';
  const char* end = std::strrchr(text, ')');  // "pid (comm) state ...": comm may hold spaces
  return end == nullptr || end[1] != ' ' || (end[2] != 'Z' && end[2] != 'X');
}

}  // namespace

// The table's mutex, taken; a process that ended holding it (EOWNERDEAD) fails the group.
class AgExchange::Lock {
 public:
  explicit Lock(AgExchange& ex) : ex_(ex) {
    if (pthread_mutex_lock(&ex_.table_->mu) == EOWNERDEAD) ex_.OwnerDied();
  }
  ~Lock() { pthread_mutex_unlock(&ex_.table_->mu); }

 private:
  AgExchange& ex_;
};

void AgExchange::OwnerDied() {
  pthread_mutex_consistent(&table_->mu);
  FailLocked("a process of the all-gather's group ended while holding the group's exchange");
}

AgExchange::~AgExchange() {
  if (shared_) {
    munmap(table_, bytes_);
  } else {
    pthread_mutex_destroy(&table_->mu);
    delete table_;
  }
}

std::unique_ptr<AgExchange> AgExchange::CreateLocal(int nranks) {
  auto* t = new AgExchangeTable;
  InitTable(t, nranks);
  if (!InitPrimitives(t).empty()) {
    delete t;
    return nullptr;
  }
  t->magic = kMagic;
  return std::unique_ptr<AgExchange>(new AgExchange(t, false, sizeof(*t)));
}

std::string AgExchange::OpenShared(const std::string& name, int nranks, int rank, bool create,
                                   int timeout_ms, std::unique_ptr<AgExchange>* out) {
  if (nranks < 1 || nranks > kAgMaxRanks || rank < 0 || rank >= nranks) {
    return "the exchange takes 1 to " + std::to_string(kAgMaxRanks) + " ranks (got rank " +
           std::to_string(rank) + " of " + std::to_string(nranks) + ")";
  }
  const size_t bytes = sizeof(AgExchangeTable);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int fd = -1;
  if (create) {
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return Errno("creating the exchange " + name);
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const std::string why = Errno("sizing the exchange " + name);
      close(fd);
      shm_unlink(name.c_str());
      return why;
    }
  } else {
    // The creator may not have made it yet; a segment still being sized reads short.
    struct stat st {};
    while ((fd = shm_open(name.c_str(), O_RDWR, 0600)) < 0 ||
           fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
      if (fd >= 0) close(fd);
      fd = -1;
      if (std::chrono::steady_clock::now() >= deadline) {
        return "the exchange " + name + " was not created within " + std::to_string(timeout_ms) +
               " ms (did its creating rank reach this call?)";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    const std::string why = Errno("mapping the exchange " + name);
    if (create) shm_unlink(name.c_str());
    return why;
  }
  auto* t = static_cast<AgExchangeTable*>(p);
  if (create) {
    InitTable(t, nranks);
    const std::string why = InitPrimitives(t);
    if (!why.empty()) {
      munmap(p, bytes);
      shm_unlink(name.c_str());
      return why;
    }
    __atomic_store_n(&t->magic, kMagic, __ATOMIC_RELEASE);
  } else {
    while (__atomic_load_n(&t->magic, __ATOMIC_ACQUIRE) != kMagic) {
      if (std::chrono::steady_clock::now() >= deadline) {
        munmap(p, bytes);
        return "the exchange " + name + " was not initialized within " +
               std::to_string(timeout_ms) + " ms";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (t->nranks != nranks) {
      munmap(p, bytes);
      return "the exchange " + name + " has " + std::to_string(t->nranks) + " ranks, this one " +
             std::to_string(nranks);
    }
  }
  std::unique_ptr<AgExchange> ex(new AgExchange(t, true, bytes));
  {
    Lock lock(*ex);
    t->pid[rank] = static_cast<int32_t>(getpid());
    // The last process to map it removes the name: nothing is left in /dev/shm, and the
    // mappings last as long as the processes.
    if (++t->opened == nranks) shm_unlink(name.c_str());
  }
  ex->Notify();
  *out = std::move(ex);
  return "";
}

void AgExchange::FailLocked(const std::string& why) {
  if (table_->failure[0] != '\0') return;
  const size_t n = std::min(why.size(), static_cast<size_t>(kAgFailureBytes - 1));
  std::memcpy(table_->failure, why.data(), n);
  table_->failure[n] = '\0';
}

void AgExchange::Fail(const std::string& why) {
  {
    Lock lock(*this);
    FailLocked(why);
  }
  Notify();
}

std::string AgExchange::failure() {
  Lock lock(*this);
  return table_->failure;
}

// A wait's liveness checks: the first after kAgPollMs of waiting, then one every kAgPollMs.
// Not one per wake-up: every change to the table wakes every waiter of the group (tens of
// changes per call at 4 ranks), and a check reads each peer's /proc/<pid>/stat under the lock,
// tens of microseconds in a process with hundreds of threads, as JAX's are.
class AgExchange::LivenessCheck {
 public:
  LivenessCheck() : next_(std::chrono::steady_clock::now() + kPoll) {}
  // Under the lock: the first peer whose process has ended, if a check is due ("" if not).
  std::string DeadPeerLocked(AgExchange& ex, int me) {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_) return "";
    next_ = now + kPoll;
    return ex.DeadPeerLocked(me);
  }
  std::chrono::steady_clock::time_point next() const { return next_; }

 private:
  static constexpr std::chrono::milliseconds kPoll{kAgPollMs};
  std::chrono::steady_clock::time_point next_;
};

std::string AgExchange::DeadPeerLocked(int me) {
  if (!shared_) return "";
  const int32_t mine = table_->pid[me];
  for (int q = 0; q < table_->nranks; ++q) {
    const int32_t pid = table_->pid[q];
    if (q != me && pid != mine && !Alive(pid)) {
      return "the process of rank " + std::to_string(q) + " (pid " + std::to_string(pid) +
             ") ended";
    }
  }
  return "";
}

void AgExchange::WaitSliceLocked(std::chrono::steady_clock::time_point until) {
  const auto now = std::chrono::steady_clock::now();
  // Read under the lock, after the caller's check: a change made after it bumps the word first,
  // and then the wait below returns at once.
  const uint32_t seen = __atomic_load_n(&table_->wakeups, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&table_->mu);
  FutexWait(&table_->wakeups, seen, until - now);
  if (pthread_mutex_lock(&table_->mu) == EOWNERDEAD) OwnerDied();
}

void AgExchange::Notify() {
  __atomic_add_fetch(&table_->wakeups, 1, __ATOMIC_SEQ_CST);
  FutexWakeAll(&table_->wakeups);
}

std::string AgExchange::Publish(int rank, const AgEntry& entry) {
  std::string failed;
  {
    Lock lock(*this);
    table_->entry[rank][entry.epoch % kAgRing] = entry;
    failed = table_->failure;
  }
  Notify();
  return failed;
}

std::string AgExchange::AwaitEntry(int me, int q, uint32_t e, std::chrono::milliseconds timeout,
                                   AgEntry* out) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::string failed;
  {
    Lock lock(*this);
    const AgEntry& slot = table_->entry[q][e % kAgRing];
    LivenessCheck liveness;
    while (slot.epoch != e && table_->failure[0] == '\0') {
      const std::string dead = liveness.DeadPeerLocked(*this, me);
      if (!dead.empty()) {
        FailLocked(dead + " before all-gather call " + std::to_string(e));
        break;
      }
      if (std::chrono::steady_clock::now() >= until) {
        FailLocked("rank " + std::to_string(q) + " did not reach all-gather call " +
                   std::to_string(e) + " within " + Seconds(timeout));
        break;
      }
      WaitSliceLocked(std::min(until, liveness.next()));
    }
    if (slot.epoch == e) {  // even after a failure: the caller releases that peer's flags
      *out = slot;
      return "";
    }
    table_->released[me][q] = e;
    failed = table_->failure;
  }
  Notify();
  return failed;
}

uint32_t AgExchange::ReleaseAllPeers(int me, uint32_t e) {
  Lock lock(*this);
  uint32_t given_up = 0;
  for (int q = 0; q < table_->nranks; ++q) {
    if (q == me || table_->taken[me][q] == e) continue;
    table_->released[me][q] = e;
    given_up |= uint32_t{1} << q;
  }
  return given_up;
}

bool AgExchange::PeerGaveUp(int q, int me, uint32_t e) {
  Lock lock(*this);
  return table_->released[q][me] == e;
}

bool AgExchange::TakeEntry(int q, int me, uint32_t e) {
  Lock lock(*this);
  if (table_->released[q][me] == e) return false;
  table_->taken[q][me] = e;
  return true;
}

void AgExchange::NoteWaited(int q, int r, uint32_t e) {
  {
    Lock lock(*this);
    table_->waited[q][r] = e;
  }
  Notify();
}

std::string AgExchange::AwaitRingSlot(int me, uint32_t e, std::chrono::milliseconds timeout) {
  if (e <= static_cast<uint32_t>(kAgRing)) return "";
  const uint32_t previous = e - kAgRing;
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::string failed;
  {
    Lock lock(*this);
    auto ready = [&] {
      for (int r = 0; r < table_->nranks; ++r) {
        if (static_cast<int32_t>(table_->waited[me][r] - previous) < 0) return false;
      }
      return true;
    };
    LivenessCheck liveness;
    while (!ready() && table_->failure[0] == '\0') {
      const std::string dead = liveness.DeadPeerLocked(*this, me);
      if (!dead.empty()) {
        FailLocked(dead + " before taking all-gather call " + std::to_string(previous));
        break;
      }
      if (std::chrono::steady_clock::now() >= until) {
        FailLocked("a peer's copy thread did not take all-gather call " +
                   std::to_string(previous) + " within " + Seconds(timeout));
        break;
      }
      WaitSliceLocked(std::min(until, liveness.next()));
    }
    failed = table_->failure;
  }
  if (!failed.empty()) Notify();
  return failed;
}

void AgExchange::LockForeverForTests() { pthread_mutex_lock(&table_->mu); }

}  // namespace fo_jax
