// The guard (docs/codec.md §9, format version 6): each codec's error on a session, relative to the
// part of the vectors that varies, measured at checkpoint time on a sample of the tokens.
//
// Why relative to the varying part: a component shared by every vector of a head (a K bias)
// shifts every attention score of a query equally and cancels in softmax, while TurboQuant's
// error scales with the whole norm. A codec whose error swamps the varying part destroys the
// session silently (Qwen2.5's layer 0 keys at plain tq3: 96x; docs/lab/kv_energy.md).
#ifndef TQKV_SRC_CHECKPOINT_CODEC_GUARD_H_
#define TQKV_SRC_CHECKPOINT_CODEC_GUARD_H_

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "tqkv/codec.h"
#include "tqkv/container.h"
#include "tqkv/status.h"

namespace tqkv {

class ThreadPool;

// At most this many tokens of a layer are measured: every GuardStride(tokens)-th token.
inline constexpr uint64_t kGuardSampleTokens = 1024;
// ceil(tokens / kGuardSampleTokens), at least 1.
uint32_t GuardStride(uint64_t tokens);

// Gives layer `layer`'s K and V tensors (canonical layout, the session's dtype).
using LayerTensorsFn = std::function<Status(uint32_t layer, const void* tensors[2])>;
// The candidate codecs of a layer's K (kv 0) or V (kv 1) tensor.
using CandidatesFn = std::function<std::vector<const Codec*>(uint32_t layer, int kv)>;
// [layer][kv][candidate]
using CandidateErrors = std::vector<std::array<std::vector<TensorCodecError>, 2>>;

// Measures every candidate of every layer and tensor on tokens t % stride == 0 of the session
// `h` describes (geometry, tokens, source dtype, key means). A TurboQuant K candidate is
// measured the way the checkpoint stores it: mean-removed when h.key_mean_block != 0 (means
// over all tokens, residual encoded, α·μ added back); a split codec's group metadata is
// selected over all tokens. Vectors with a non-finite element are left out of the sums, and so
// are finite ones the codec stores as NaN (an f32 sum of squares that overflows, unless the
// row is exact): both restore as NaN (docs/codec.md §5), and the sums stay finite.
// `residual` holds tokens × kv_heads × head_dim floats when h has key means.
Result<CandidateErrors> MeasureCodecErrors(const ContainerHeader& h, uint32_t stride,
                                           const LayerTensorsFn& layer_tensors,
                                           const CandidatesFn& candidates, float* residual,
                                           ThreadPool* pool);

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_CODEC_GUARD_H_
