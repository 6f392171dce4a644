// Host memory a restore works in (its read-ahead slots; a streamed restore's layer buffers),
// kept between restores: fresh memory costs a first touch on every restore (26 ms per 64 MiB in
// 4 KiB pages on the development VM, and more where a VM's host has taken freed memory back),
// while a server restores one session after another.
#ifndef TQKV_SRC_CHECKPOINT_RESTORE_MEMORY_H_
#define TQKV_SRC_CHECKPOINT_RESTORE_MEMORY_H_

#include <cstddef>

#include "tqkv/aligned_buffer.h"
#include "tqkv/status.h"

namespace tqkv {

// Bytes of finished restores' memory kept at most: the peak of concurrent restores, e.g. 8 with
// 64 MiB of read-ahead and two 51 MB layer buffers each (50K Qwen2.5-7B tokens, streamed) keep
// 1.3 GB.
inline constexpr size_t kRestoreMemoryKept = size_t{2} << 30;

// A region of at least `bytes` on 2 MiB boundaries, huge pages advised (a 1 MiB O_DIRECT read
// into 4 KiB pages has more segments than a virtio disk merges): the smallest kept one that is
// large enough, or a new one.
Result<AlignedBuffer> TakeRestoreMemory(size_t bytes);

// Keeps `region` for a later TakeRestoreMemory while at most kRestoreMemoryKept bytes are kept, else
// frees it.
void ReturnRestoreMemory(AlignedBuffer region);

// Bytes kept now (tests).
size_t RestoreMemoryKeptBytes();

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_RESTORE_MEMORY_H_
