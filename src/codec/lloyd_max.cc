#include "codec/lloyd_max.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "common/prng.h"

namespace tqkv::codec {
namespace {

constexpr size_t kIntervals = size_t{1} << 18;
constexpr int kMaxIterations = 100000;
constexpr double kTolerance = 1e-12;

#include "codec/lloyd_max_gaussian.inc"

// The density on a uniform grid, and cumulative moments M_k(z_i) = int_{-L}^{z_i} z^k f(z) dz of
// its piecewise-linear interpolant (normalised so that M_0(L) = 1).
class Grid {
 public:
  explicit Grid(uint32_t m) {
    const double md = m;
    lo_ = -std::min(std::sqrt(md), 16.0);
    h_ = -2.0 * lo_ / kIntervals;
    f_.resize(kIntervals + 1);
    const double expo = (md - 3.0) / 2.0;
    for (size_t i = 0; i <= kIntervals; ++i) {
      const double z = Z(i);
      const double u = 1.0 - z * z / md;
      f_[i] =
          (u <= 0.0) ? (expo == 0.0 ? 1.0 : 0.0) : (expo == 0.0 ? 1.0 : DetExp(expo * DetLog(u)));
    }
    for (auto& c : cum_) c.assign(kIntervals + 1, 0.0);
    for (size_t i = 0; i < kIntervals; ++i) {
      double part[3];
      Partial(i, Z(i + 1), part);
      for (int k = 0; k < 3; ++k) cum_[k][i + 1] = cum_[k][i] + part[k];
    }
    const double total = cum_[0][kIntervals];
    for (auto& c : cum_) {
      for (auto& v : c) v /= total;
    }
    for (auto& v : f_) v /= total;
  }

  double lo() const { return lo_; }
  double hi() const { return -lo_; }
  // M_k(t) for t anywhere (clamped to [-L, L]).
  void Moments(double t, double out[3]) const {
    if (t <= lo_) {
      out[0] = out[1] = out[2] = 0.0;
      return;
    }
    if (t >= -lo_) {
      for (int k = 0; k < 3; ++k) out[k] = cum_[k][kIntervals];
      return;
    }
    size_t i = static_cast<size_t>((t - lo_) / h_);
    if (i >= kIntervals) i = kIntervals - 1;
    double part[3];
    Partial(i, t, part);
    for (int k = 0; k < 3; ++k) out[k] = cum_[k][i] + part[k];
  }
  // Smallest grid point z with M_0(z) >= p (for the initial quantiles).
  double Quantile(double p) const {
    const auto it = std::lower_bound(cum_[0].begin(), cum_[0].end(), p);
    return Z(static_cast<size_t>(it - cum_[0].begin()));
  }

 private:
  double Z(size_t i) const { return lo_ + h_ * static_cast<double>(i); }
  // Exact integrals over [z_i, t] of z^k * f(z), f linear between f_i and f_{i+1}. Written in the
  // local coordinate s = z - z_i (no cancellation between large powers of z).
  void Partial(size_t i, double t, double out[3]) const {
    const double a = Z(i);
    const double w = t - a;
    const double f0 = f_[i];
    const double slope = (f_[i + 1] - f_[i]) / h_;
    const double w2 = w * w, w3 = w2 * w, w4 = w3 * w;
    out[0] = f0 * w + slope * w2 / 2.0;
    out[1] = a * f0 * w + (a * slope + f0) * w2 / 2.0 + slope * w3 / 3.0;
    out[2] = a * a * f0 * w + (a * a * slope + 2.0 * a * f0) * w2 / 2.0 +
             (2.0 * a * slope + f0) * w3 / 3.0 + slope * w4 / 4.0;
  }

  double lo_ = 0.0, h_ = 0.0;
  std::vector<double> f_;
  std::vector<double> cum_[3];
};

Codebook Solve(const Grid& grid, uint32_t m, uint32_t bits) {
  const size_t k = size_t{1} << bits;
  Codebook cb;
  cb.dim = m;
  cb.bits = bits;
  std::vector<double> c(k), next(k), t(k + 1);
  for (size_t i = 0; i < k; ++i) c[i] = grid.Quantile((static_cast<double>(i) + 0.5) / k);
  std::vector<double> mom(3 * (k + 1));
  auto boundaries = [&](const std::vector<double>& cc) {
    t[0] = grid.lo();
    t[k] = grid.hi();
    for (size_t i = 1; i < k; ++i) t[i] = 0.5 * (cc[i - 1] + cc[i]);
    for (size_t i = 0; i <= k; ++i) grid.Moments(t[i], &mom[3 * i]);
  };
  int it = 0;
  for (; it < kMaxIterations; ++it) {
    boundaries(c);
    double delta = 0.0;
    for (size_t i = 0; i < k; ++i) {
      const double p = mom[3 * (i + 1)] - mom[3 * i];
      const double z1 = mom[3 * (i + 1) + 1] - mom[3 * i + 1];
      next[i] = p > 0.0 ? z1 / p : 0.5 * (t[i] + t[i + 1]);
    }
    // The density is even: keep the codebook exactly symmetric.
    for (size_t i = 0; i < k / 2; ++i) {
      const double v = 0.5 * (next[k - 1 - i] - next[i]);
      next[i] = -v;
      next[k - 1 - i] = v;
    }
    for (size_t i = 0; i < k; ++i) delta = std::max(delta, std::fabs(next[i] - c[i]));
    c.swap(next);
    if (delta < kTolerance) {
      ++it;
      break;
    }
  }
  boundaries(c);
  double err = 0.0;
  for (size_t i = 0; i < k; ++i) {
    const double p = mom[3 * (i + 1)] - mom[3 * i];
    const double z1 = mom[3 * (i + 1) + 1] - mom[3 * i + 1];
    const double z2 = mom[3 * (i + 1) + 2] - mom[3 * i + 2];
    // E[(z - c)^2 ; bin] = z2 - 2 c z1 + c^2 p (equals the E z^2 - sum p c^2 form at the optimum).
    err += z2 - 2.0 * c[i] * z1 + c[i] * c[i] * p;
  }
  cb.centroids = std::move(c);
  cb.mse = err;
  cb.iterations = it;
  return cb;
}

}  // namespace

std::shared_ptr<const Codebook> SolveLloydMax(uint32_t m, uint32_t bits) {
  if (m < 3 || bits < 1 || bits > 8) return nullptr;
  const Grid grid(m);
  return std::make_shared<const Codebook>(Solve(grid, m, bits));
}

std::shared_ptr<const Codebook> LloydMaxCodebook(uint32_t m, uint32_t bits) {
  if (m < 3 || bits < 1 || bits > 8) return nullptr;
  static std::mutex mu;
  static std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const Codebook>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({m, bits});
  if (it != cache.end()) return it->second;
  std::shared_ptr<const Codebook> cb;
  if (m == kTableDim) {
    const TableEntry& e = kTable[bits - 1];
    Codebook t;
    t.dim = m;
    t.bits = bits;
    t.centroids.assign(e.centroids, e.centroids + (size_t{1} << bits));
    t.mse = e.mse;
    t.iterations = e.iterations;
    cb = std::make_shared<const Codebook>(std::move(t));
  } else {
    cb = SolveLloydMax(m, bits);
  }
  cache.emplace(std::make_pair(m, bits), cb);
  return cb;
}

}  // namespace tqkv::codec
