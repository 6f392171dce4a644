#include "checkpoint/bit_allocator.h"

#include <algorithm>
#include <string>

#include "format/container_layout.h"

namespace tqkv {
namespace {

double Objective(const TensorCodecError& e) { return std::min(RelativeError(e), 1e30); }

}  // namespace

std::vector<const char*> AllocatorCandidates(AllocatorFamily family) {
  std::vector<const char*> out;
  if (family != AllocatorFamily::kTransform) {
    out.insert(out.end(), kAllocatorPresets.begin(), kAllocatorPresets.end());
  }
  if (family != AllocatorFamily::kTurboQuant) {
    out.insert(out.end(), kAllocatorTransforms.begin(), kAllocatorTransforms.end());
  }
  return out;
}

Result<uint64_t> ContainerFileBytes(const ContainerHeader& h) {
  using namespace format;  // NOLINT
  const uint64_t align = h.payload_alignment;
  uint64_t end = AlignUp(kPreambleBytes + EncodeHeaderBody(h).size(), align);
  uint64_t count = 0;
  for (ChunkSequence seq(h); !seq.done(); seq.Advance(), ++count) {
    TQKV_ASSIGN_OR_RETURN(const uint64_t size, ExpectedChunkBytes(h, seq.current().Entry()));
    end = AlignUp(end, align) + size;
  }
  return end + kIndexFixedBytes + kIndexRecordBytes * count + kFooterBytes;
}

Result<std::vector<std::array<uint8_t, 2>>> AllocateGreedy(const CandidateErrors& errors,
                                                           const TensorBytes& bytes,
                                                           uint64_t budget) {
  const size_t layers = errors.size();
  std::vector<std::array<uint8_t, 2>> choice(layers);
  uint64_t total = 0;
  for (size_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto& b = bytes[l][kv];
      const auto cheapest = std::min_element(b.begin(), b.end()) - b.begin();
      choice[l][kv] = static_cast<uint8_t>(cheapest);
      total += b[cheapest];
    }
  }
  if (total > budget) {
    return Status::InvalidArgument("the cheapest codecs need " + std::to_string(total) +
                                   " bytes, over the budget of " + std::to_string(budget));
  }
  for (;;) {
    double best_gain = 0;
    size_t best_l = 0;
    int best_kv = 0;
    uint8_t best_c = 0;
    for (size_t l = 0; l < layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint8_t cur = choice[l][kv];
        const double err = Objective(errors[l][kv][cur]);
        for (size_t c = 0; c < bytes[l][kv].size(); ++c) {
          const uint64_t from = bytes[l][kv][cur], to = bytes[l][kv][c];
          const double gain = err - Objective(errors[l][kv][c]);
          if (to <= from || gain <= 0 || total - from + to > budget) continue;
          const double per_byte = gain / static_cast<double>(to - from);
          if (per_byte > best_gain) {
            best_gain = per_byte;
            best_l = l;
            best_kv = kv;
            best_c = static_cast<uint8_t>(c);
          }
        }
      }
    }
    if (best_gain == 0) break;
    total += bytes[best_l][best_kv][best_c] - bytes[best_l][best_kv][choice[best_l][best_kv]];
    choice[best_l][best_kv] = best_c;
  }
  return choice;
}

}  // namespace tqkv
