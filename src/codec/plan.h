// The plan of a TurboQuant codec: everything the encode/decode arithmetic reads, built once from
// stored CodecParams. One definition, used by the CPU codec (turboquant.cc) and by the CUDA
// parameter packer (src/cuda/params.cc), so the two cannot disagree on a rotation, a threshold, a
// scale or an offset.
#ifndef TQKV_SRC_CODEC_PLAN_H_
#define TQKV_SRC_CODEC_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/kernels/kernels.h"
#include "codec/rotation.h"
#include "tqkv/codec.h"
#include "tqkv/status.h"

namespace tqkv::codec {

// One channel subset: subset 0 is the outliers of a split codec (the channels the group mask
// marks, ascending), subset 1 the rest (ascending); an unsplit codec has one subset, all channels.
struct PlannedSubset {
  uint32_t channels = 0;  // m
  uint32_t bits = 0;      // index bits
  Rotation rotation;      // kind and its arrays, from MakeRotation(kind, seed, m)
  std::vector<float> centroids;   // 2^bits, as stored
  std::vector<float> thresholds;  // 2^bits - 1: t_k = 0.5f * (c_k + c_{k+1})
  float enc_scale = 1.0f;         // RotationScales(kind, m)
  float dec_scale = 1.0f;
  size_t norm_offset = 0;    // bytes within one code
  size_t planes_offset = 0;  // bytes within one code
  size_t planes_bytes = 0;   // bits * ceil(m / 8)
};

class CodecPlan {
 public:
  // params must be a TurboQuant codec that passed ValidateCodecParams.
  static CodecPlan Build(const CodecParams& params);

  // Arrays are owned here and kernel views point into them: moving keeps them valid, copying
  // would not.
  CodecPlan(CodecPlan&&) = default;
  CodecPlan& operator=(CodecPlan&&) = default;
  CodecPlan(const CodecPlan&) = delete;
  CodecPlan& operator=(const CodecPlan&) = delete;

  uint32_t head_dim() const { return head_dim_; }
  size_t code_bytes() const { return code_bytes_; }
  size_t meta_bytes() const { return meta_bytes_; }  // group outlier mask, 0 when unsplit
  DType norm_dtype() const { return norm_dtype_; }
  bool norm_correction() const { return norm_correction_; }
  bool split() const { return subsets_.size() == 2; }
  const std::vector<PlannedSubset>& subsets() const { return subsets_; }
  size_t qjl_offset() const { return qjl_offset_; }  // gamma + signs, after the planes (qjl only)

  // The kernel layer's view of subset i (pointers into this plan).
  kernels::SubsetPlan KernelPlan(size_t i) const;

  // Checks a group mask of a split codec: subset 0 is the channels it marks, ascending, subset 1
  // the others, ascending (the kernels' split_gather/split_scatter move them). InvalidArgument
  // (prefixed by `what`) for a mask of the wrong size, a marked channel >= head_dim, or a count
  // other than subset 0's. Ok when unsplit.
  Status CheckMask(const char* what, std::span<const uint8_t> meta) const;

 private:
  CodecPlan() = default;

  uint32_t head_dim_ = 0;
  size_t code_bytes_ = 0;
  size_t meta_bytes_ = 0;
  DType norm_dtype_ = DType::kF32;
  bool norm_correction_ = false;
  size_t qjl_offset_ = 0;
  std::vector<PlannedSubset> subsets_;
};

}  // namespace tqkv::codec

#endif  // TQKV_SRC_CODEC_PLAN_H_
