// Heap buffers aligned for O_DIRECT and SIMD; reusable without re-touching pages.
#ifndef TQKV_INCLUDE_TQKV_ALIGNED_BUFFER_H_
#define TQKV_INCLUDE_TQKV_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "tqkv/status.h"

namespace tqkv {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Aborts if the memory cannot be had (see Reserve); sizes from users or files use TryReserve.
  AlignedBuffer(size_t size, size_t alignment = 4096);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Grows (never shrinks) the capacity; contents are not preserved on growth. ResourceExhausted
  // (and an empty buffer) when `size` rounded up to the alignment does not fit or the system
  // refuses the memory.
  Status TryReserve(size_t size);
  // TryReserve for sizes the caller has bounded; aborts with a message if it fails anyway.
  void Reserve(size_t size);
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<uint8_t> span() { return {data_, size_}; }
  std::span<const uint8_t> span() const { return {data_, size_}; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t alignment_ = 4096;
};

inline constexpr uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
inline constexpr uint64_t AlignDown(uint64_t x, uint64_t a) { return x / a * a; }

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_ALIGNED_BUFFER_H_
