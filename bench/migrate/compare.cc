#include "bench/migrate/compare.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <span>

#include "model/engine.h"
#include "tqkv/types.h"

namespace tqkv {
namespace {

// log-softmax in double.
std::vector<double> LogSoftmax(const float* x, size_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(x[i]) - lse;
  return out;
}

}  // namespace

LogitStats CompareLogits(const std::vector<float>& ref, const std::vector<float>& got, size_t steps,
                         size_t vocab) {
  LogitStats s;
  for (size_t i = 0; i < steps; ++i) {
    const float* a = ref.data() + i * vocab;
    const float* b = got.data() + i * vocab;
    if (model::ArgMax({a, vocab}) == model::ArgMax({b, vocab})) {
      ++s.top1;
    } else {
      s.disagree.push_back(static_cast<uint32_t>(i));
    }
    const std::vector<double> la = LogSoftmax(a, vocab), lb = LogSoftmax(b, vocab);
    double kl = 0;
    for (size_t j = 0; j < vocab; ++j) {
      kl += std::exp(la[j]) * (la[j] - lb[j]);
      s.max_logit_diff = std::max(s.max_logit_diff, std::fabs(static_cast<double>(a[j]) - b[j]));
    }
    kl = std::max(kl, 0.0);  // rounding can make a tiny KL slightly negative
    s.kl.push_back(kl);
    s.kl_mean += kl;
    s.kl_max = std::max(s.kl_max, kl);
  }
  if (steps) s.kl_mean /= static_cast<double>(steps);
  return s;
}

std::vector<double> Margins(const std::vector<float>& logits, size_t steps, size_t vocab) {
  std::vector<double> out;
  for (size_t i = 0; i < steps; ++i) {
    std::vector<float> l(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
    std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
    out.push_back(static_cast<double>(l[0]) - l[1]);
  }
  return out;
}

double MeanCosine(const uint16_t* ref, const uint16_t* got, uint64_t vectors, uint32_t dim) {
  double total = 0;
  uint64_t live = 0;
  for (uint64_t v = 0; v < vectors; ++v) {
    double dot = 0, na = 0, nb = 0;
    for (uint32_t i = 0; i < dim; ++i) {
      const double x = HalfToFloat(ref[v * dim + i]), y = HalfToFloat(got[v * dim + i]);
      dot += x * y;
      na += x * x;
      nb += y * y;
    }
    if (na == 0) continue;
    ++live;
    if (nb > 0) total += dot / std::sqrt(na * nb);
  }
  return live ? total / static_cast<double>(live) : 1.0;
}

}  // namespace tqkv
