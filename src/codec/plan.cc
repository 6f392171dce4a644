#include "codec/plan.h"

#include <string>

namespace tqkv::codec {

CodecPlan CodecPlan::Build(const CodecParams& params) {
  CodecPlan plan;
  plan.head_dim_ = params.head_dim;
  plan.code_bytes_ = CodeBytesOf(params);
  plan.meta_bytes_ = GroupMetaBytesOf(params);
  plan.norm_dtype_ = params.norm_dtype;
  plan.norm_correction_ = params.norm_correction;
  const size_t norm_bytes = DTypeSize(params.norm_dtype);
  plan.subsets_.resize(params.subsets.size());
  size_t planes_at = norm_bytes * params.subsets.size();
  for (size_t i = 0; i < params.subsets.size(); ++i) {
    const SubsetParams& sp = params.subsets[i];
    PlannedSubset& s = plan.subsets_[i];
    s.channels = sp.channels;
    s.bits = sp.bits;
    s.rotation = MakeRotation(sp.rotation, sp.seed, sp.channels);
    s.centroids = sp.centroids;
    for (size_t k = 0; k + 1 < s.centroids.size(); ++k) {
      s.thresholds.push_back(0.5f * (s.centroids[k] + s.centroids[k + 1]));
    }
    RotationScales(sp.rotation, sp.channels, &s.enc_scale, &s.dec_scale);
    s.norm_offset = i * norm_bytes;
    s.planes_offset = planes_at;
    s.planes_bytes = size_t{sp.bits} * ((sp.channels + 7u) / 8u);
    planes_at += s.planes_bytes;
  }
  plan.qjl_offset_ = planes_at;
  return plan;
}

kernels::SubsetPlan CodecPlan::KernelPlan(size_t i) const {
  const PlannedSubset& s = subsets_[i];
  const Rotation& r = s.rotation;
  kernels::SubsetPlan p;
  p.dim = s.channels;
  p.bits = s.bits;
  p.rotation = r.kind;
  p.block = r.block;
  p.signs1 = r.signs1.empty() ? nullptr : r.signs1.data();
  p.signs2 = r.signs2.empty() ? nullptr : r.signs2.data();
  p.haar = r.q.empty() ? nullptr : r.q.data();
  p.haar_t = r.qt.empty() ? nullptr : r.qt.data();
  p.centroids = s.centroids.data();
  p.thresholds = s.thresholds.data();
  p.enc_scale = s.enc_scale;
  p.dec_scale = s.dec_scale;
  p.norm_correction = norm_correction_;
  p.norm_dtype = norm_dtype_;
  return p;
}

Status CodecPlan::CheckMask(const char* what, std::span<const uint8_t> meta) const {
  if (!split()) return Status::Ok();
  const size_t d = head_dim_;
  if (meta.size() != meta_bytes_) {
    return Status::InvalidArgument(std::string(what) + ": group meta has " +
                                   std::to_string(meta.size()) + " bytes, need " +
                                   std::to_string(meta_bytes_));
  }
  size_t marked = 0;
  for (size_t c = 0; c < meta_bytes_ * 8; ++c) {
    const bool set = (meta[c / 8] >> (c % 8)) & 1u;
    if (set && c >= d) {
      return Status::InvalidArgument(std::string(what) + ": group meta marks channel " +
                                     std::to_string(c) + " >= head_dim");
    }
    marked += set ? 1 : 0;
  }
  if (marked != subsets_[0].channels) {
    return Status::InvalidArgument(std::string(what) + ": group meta marks " +
                                   std::to_string(marked) + " outlier channels, need " +
                                   std::to_string(subsets_[0].channels));
  }
  return Status::Ok();
}

}  // namespace tqkv::codec
