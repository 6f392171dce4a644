#include "checkpoint/slot_reader.h"

#include <algorithm>
#include <utility>

namespace tqkv {

SlotReader::SlotReader(size_t slots, size_t chunks, ReadFn read, ReadFn verify,
                       std::function<void()> thread_init, size_t lanes)
    : chunks_(chunks),
      max_batch_(std::max<size_t>(1, slots / std::clamp<size_t>(lanes, 1, std::max<size_t>(1, slots)))),
      read_(std::move(read)),
      verify_(std::move(verify)) {
  for (size_t i = 0; i < slots; ++i) free_.push_back(i);
  lanes = std::clamp<size_t>(lanes, 1, std::max<size_t>(1, slots));
  for (size_t i = 0; i < lanes; ++i) {
    lanes_.emplace_back([this, init = thread_init] {
      if (init) init();
      ReadLoop();
    });
  }
  if (verify_) verifier_ = std::thread([this] { VerifyLoop(); });
}

SlotReader::~SlotReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  for (std::thread& t : lanes_) t.join();
  if (verifier_.joinable()) verifier_.join();
}

Result<size_t> SlotReader::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || !status_.ok(); });
  if (!ready_.empty()) {
    const size_t s = ready_.front();
    ready_.pop_front();
    return s;
  }
  return status_;
}

void SlotReader::Release(size_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(slot);
  cv_.notify_all();
}

void SlotReader::Publish(Batch& b, Status st) {
  if (!st.ok()) {
    if (status_.ok()) status_ = std::move(st);
  } else {
    for (size_t s : b.slots) ready_.push_back(s);
  }
  cv_.notify_all();
}

void SlotReader::PublishInOrder() {
  while (status_.ok()) {
    auto it = read_done_.find(next_out_);
    if (it == read_done_.end()) return;
    Batch b = std::move(it->second);
    read_done_.erase(it);
    next_out_ += b.slots.size();
    Publish(b, std::move(b.status));
  }
}

void SlotReader::ReadLoop() {
  for (;;) {
    // Take the free slots (at least one, at most max_batch_) for the next chunks in order.
    Batch b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || read_failed_ || next_ >= chunks_ || !free_.empty(); });
      if (stop_ || read_failed_ || next_ >= chunks_) return;
      b.first = next_;
      while (!free_.empty() && b.slots.size() < max_batch_ && next_ < chunks_) {
        b.slots.push_back(free_.front());
        free_.pop_front();
        ++next_;
      }
      if (reading_++ == 0) busy_since_ = Clock::now();
    }
    Status st = read_(b.slots, b.first);
    std::lock_guard<std::mutex> lock(mu_);
    if (--reading_ == 0) busy_ += std::chrono::duration<double>(Clock::now() - busy_since_).count();
    if (!st.ok()) read_failed_ = true;
    b.status = std::move(st);
    const size_t first = b.first;
    read_done_.emplace(first, std::move(b));
    if (!verify_) PublishInOrder();
    cv_.notify_all();
  }
}

void SlotReader::VerifyLoop() {
  while (true) {
    Batch b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || read_done_.count(next_out_) != 0; });
      auto it = read_done_.find(next_out_);
      if (it == read_done_.end()) return;  // stopping
      b = std::move(it->second);
      read_done_.erase(it);
    }
    Status st = std::move(b.status);
    double dt = 0;
    if (st.ok()) {
      const auto t = Clock::now();
      st = verify_(b.slots, b.first);
      dt = std::chrono::duration<double>(Clock::now() - t).count();
    }
    std::lock_guard<std::mutex> lock(mu_);
    verify_busy_ += dt;
    next_out_ += b.slots.size();
    const bool failed = !st.ok();
    Publish(b, std::move(st));
    if (failed || next_out_ >= chunks_) return;
  }
}

}  // namespace tqkv
