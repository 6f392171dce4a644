// The bit allocator (docs/codec.md §10): given a budget in bits per value, every byte of the
// container counted, pick each layer's K and V codec from the presets by the errors measured on
// the session itself (the guard's metric, codec_guard.h). No calibration set.
#ifndef TQKV_SRC_CHECKPOINT_BIT_ALLOCATOR_H_
#define TQKV_SRC_CHECKPOINT_BIT_ALLOCATOR_H_

#include <array>
#include <cstdint>
#include <vector>

#include "checkpoint/codec_guard.h"
#include "tqkv/container.h"
#include "tqkv/status.h"

namespace tqkv {

// The candidates of each family (AllocatorFamily): TurboQuant's presets, and the transform
// codec at budgets spaced like them (kl:B's B counts its norm; docs/codec.md §11).
inline constexpr std::array<const char*, 5> kAllocatorPresets = {"tq2", "tq2.5", "tq3", "tq3.5",
                                                                 "tq4"};
inline constexpr std::array<const char*, 6> kAllocatorTransforms = {"kl:1.5", "kl:2", "kl:2.5",
                                                                    "kl:3",   "kl:3.5", "kl:4"};
// The specs "auto:B,from=..." measures, TurboQuant's first.
std::vector<const char*> AllocatorCandidates(AllocatorFamily family);

// Bytes of the file a header gives (the writer's canonical layout, docs/format.md §2).
Result<uint64_t> ContainerFileBytes(const ContainerHeader& header);

// Greedy by marginal error reduction per byte: start every tensor at its cheapest candidate, then
// repeatedly move one tensor to a dearer candidate with a lower relative error, the move with the
// largest (error removed) / (bytes added), while the total stays within `budget`; stop when no
// move fits. errors[layer][kv][c] and bytes[layer][kv][c] per candidate c; the objective is the
// sum of RelativeError over every layer and tensor. Returns [layer][kv] candidate indices;
// InvalidArgument when even the cheapest choice exceeds the budget.
using TensorBytes = std::vector<std::array<std::vector<uint64_t>, 2>>;
Result<std::vector<std::array<uint8_t, 2>>> AllocateGreedy(const CandidateErrors& errors,
                                                           const TensorBytes& bytes,
                                                           uint64_t budget);

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_BIT_ALLOCATOR_H_
