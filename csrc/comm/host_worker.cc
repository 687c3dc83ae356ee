// See host_worker.h.
#include "comm/host_worker.h"

#include <cuda_runtime.h>

#include <utility>

#include "kernels/epoch_compare.h"

namespace fo_jax {
namespace {

// How long the thread spins for a job, or a job for its signal, before it sleeps: longer than
// the handler's time between a push and its signal (~20 us) and than a call's host interval in
// a busy loop (~150-250 us), so that back-to-back calls never put it to sleep.
constexpr auto kSpin = std::chrono::microseconds(300);

// Spins until pred() or kSpin has passed; whether pred() held.
template <class Pred>
bool SpinFor(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

HostWorker::HostWorker(int device, uint32_t first_signal)
    : signal_(first_signal), device_(device), thread_([this] { Run(); }) {}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostWorker::WaitPending(uint64_t max_pending) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pushed_.load() - finished_.load() <= max_pending; });
}

bool HostWorker::DrainFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return pushed_.load() == finished_.load(); });
}

uint64_t HostWorker::Push(std::function<void()> job) {
  uint64_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
    n = ++pushed_;
  }
  cv_.notify_all();
  return n;
}

void HostWorker::AwaitSignal(uint32_t value) {
  if (SpinFor([&] { return EpochReached(signal_.load(), value); })) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return EpochReached(signal_.load(), value); });
}

void HostWorker::Signal(uint32_t value) {
  {
    std::lock_guard<std::mutex> lock(mu_);  // a waiter between its check and its sleep sees it
    if (!EpochReached(signal_.load(), value)) signal_.store(value);
  }
  cv_.notify_all();
}

void HostWorker::Run() {
  // A failure here surfaces in the jobs' own CUDA calls (they run on the wrong device).
  (void)cudaSetDevice(device_);
  uint64_t taken = 0;
  while (true) {
    SpinFor([&] { return pushed_.load() > taken; });
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    ++taken;
    job();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++finished_;
    }
    cv_.notify_all();
  }
}

}  // namespace fo_jax
