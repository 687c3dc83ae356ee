// See host_worker.h.
#include "comm/host_worker.h"

#include <cuda_runtime.h>

#include <utility>

namespace fo_jax {

HostWorker::HostWorker(int device) : device_(device), thread_([this] { Run(); }) {}

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
  cv_.wait(lock, [&] { return pushed_ - finished_ <= max_pending; });
}

bool HostWorker::DrainFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return pushed_ == finished_; });
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

void HostWorker::AwaitSignal(uint64_t value) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return signal_ >= value; });
}

void HostWorker::Signal(uint64_t value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (value > signal_) signal_ = value;
  }
  cv_.notify_all();
}

void HostWorker::Run() {
  // A failure here surfaces in the jobs' own CUDA calls (they run on the wrong device).
  (void)cudaSetDevice(device_);
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++finished_;
    }
    cv_.notify_all();
  }
}

}  // namespace fo_jax
