// Host memory for the restore's read-ahead slots, kept between restores: fresh memory costs a
// first touch on every restore (26 ms per 64 MiB in 4 KiB pages on the development VM, and more
// where a VM's host has taken freed memory back), while a server restores one session after
// another.
#ifndef TQKV_SRC_CHECKPOINT_SLOT_MEMORY_H_
#define TQKV_SRC_CHECKPOINT_SLOT_MEMORY_H_

#include <cstddef>

#include "tqkv/aligned_buffer.h"
#include "tqkv/status.h"

namespace tqkv {

// Bytes of finished restores' slot memory kept at most (the peak of concurrent restores' slots,
// e.g. 8 restores with 64 MiB of read-ahead each keep 512 MiB).
inline constexpr size_t kSlotMemoryKept = size_t{1} << 30;

// A region of at least `bytes` on 2 MiB boundaries, huge pages advised (a 1 MiB O_DIRECT read
// into 4 KiB pages has more segments than a virtio disk merges): the smallest kept one that is
// large enough, or a new one.
Result<AlignedBuffer> TakeSlotMemory(size_t bytes);

// Keeps `region` for a later TakeSlotMemory while at most kSlotMemoryKept bytes are kept, else
// frees it.
void ReturnSlotMemory(AlignedBuffer region);

// Bytes kept now (tests).
size_t SlotMemoryKeptBytes();

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_SLOT_MEMORY_H_
