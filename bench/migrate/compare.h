// How a restored session's continuation compares with the original's: the one definition of the
// figures of `tqkv-bench migrate` and lab/llama_migrate.py (top-1 agreement, KL, logit margins,
// vector cosines). tests/model/compare_test.cc and tests/python/test_compare.py pin both
// implementations to the same numbers (tests/data/compare_cases.json).
#ifndef TQKV_BENCH_MIGRATE_COMPARE_H_
#define TQKV_BENCH_MIGRATE_COMPARE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tqkv {

struct LogitStats {
  uint32_t top1 = 0;                // steps whose argmax (first of equals) agrees
  double kl_mean = 0, kl_max = 0;   // KL(ref || got) of the softmaxes, in double, clamped at 0
  double max_logit_diff = 0;        // max |ref - got| over every step and token
  std::vector<double> kl;           // per step
  std::vector<uint32_t> disagree;   // steps whose argmax differs
};
// `ref` and `got`: `steps` rows of `vocab` logits.
LogitStats CompareLogits(const std::vector<float>& ref, const std::vector<float>& got, size_t steps,
                         size_t vocab);

// Per step, the top-1 logit minus the top-2 logit: how near a tie the reference was.
std::vector<double> Margins(const std::vector<float>& logits, size_t steps, size_t vocab);

// Mean over vectors of cos(ref, got), in double, of `vectors` rows of `dim` f16 values; vectors
// whose reference is zero (rows a sliding-window cache lacks) are left out, a zero restored
// vector counts 0, and no vector left gives 1.
double MeanCosine(const uint16_t* ref, const uint16_t* got, uint64_t vectors, uint32_t dim);

}  // namespace tqkv

#endif  // TQKV_BENCH_MIGRATE_COMPARE_H_
