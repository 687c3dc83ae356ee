// A host thread that runs jobs one at a time in the order they were pushed, with the CUDA
// device set. The copy-engine transport hands it the copy stream's part of each call, so that
// XLA's thread returns from the FFI handler without enqueueing those ~20 stream operations
// (docs/performance.md, "The copy thread"). Jobs are numbered 1, 2, ... in push order. The
// thread and a job waiting for a signal spin for a while before they sleep: a sleeping thread
// took tens of us to wake, longer than the copy stream may wait for its first copy.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace fo_jax {

class HostWorker {
 public:
  // `first_signal`: the signal value before any Signal call (the copy engine's epoch start).
  explicit HostWorker(int device, uint32_t first_signal = 0);
  ~HostWorker();  // finishes the pushed jobs, then joins the thread
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  // Blocks until at most `max_pending` pushed jobs are unfinished.
  void WaitPending(uint64_t max_pending);
  // Queues `job`; returns its number.
  uint64_t Push(std::function<void()> job);
  // Blocks until every pushed job has finished.
  void Drain() { WaitPending(0); }
  // The same, giving up after `timeout`; whether it drained.
  bool DrainFor(std::chrono::milliseconds timeout);

  // For a job: blocks until Signal(n) was called with n >= `value` (the pusher's later progress
  // on something the job must follow, e.g. an event recorded after the push). Values are 32-bit
  // epochs compared cyclically, as the flags are (kernels/epoch_compare.h): the copy engine
  // signals its call epochs, which wrap after 2^32 calls.
  void AwaitSignal(uint32_t value);
  void Signal(uint32_t value);

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;  // every change of the counters, and stop_
  std::deque<std::function<void()>> queue_;  // pushed, not yet started (mu_)
  std::atomic<uint64_t> pushed_{0}, finished_{0};
  std::atomic<uint32_t> signal_;  // the latest signal (cyclically)
  bool stop_ = false;  // mu_
  int device_;
  std::thread thread_;
};

}  // namespace fo_jax
