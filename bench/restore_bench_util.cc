#include "bench/restore_bench_util.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <fstream>
#include <numeric>
#include <thread>

#include "tqkv/aligned_buffer.h"
#include "tqkv/checkpoint.h"
#include "tqkv/synthetic_source.h"

namespace tqkv::bench {

Stats Summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.min = v.front();
  s.max = v.back();
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
  auto pct = [&](double p) {  // linear interpolation between closest ranks
    const double r = p * (n - 1);
    const size_t lo = static_cast<size_t>(std::floor(r));
    const size_t hi = std::min(n - 1, lo + 1);
    return v[lo] + (v[hi] - v[lo]) * (r - lo);
  };
  s.p50 = pct(0.50);
  s.p99 = pct(0.99);
  double var = 0;
  for (double x : v) var += (x - s.mean) * (x - s.mean);
  s.std = n > 1 ? std::sqrt(var / (n - 1)) : 0;
  return s;
}

Progress::Progress(size_t cells, size_t workers)
    : cells_(cells), workers_(workers), tty_(isatty(STDERR_FILENO)) {}

void Progress::Cell(size_t index, const std::string& label) {
  std::lock_guard<std::mutex> lock(mu_);
  cell_ = index;
  label_ = label;
}

void Progress::Set(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  ticks_ = 0;
  if (!tty_) {
    std::fprintf(stderr, "[%zu/%zu %6.1f s] %s: %s\n", cell_ + 1, cells_, Since(start_),
                 label_.c_str(), phase_.c_str());
  }
  Draw();
}

void Progress::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  ++ticks_;
  Draw();
}

void Progress::Draw() {
  if (!tty_) return;
  const size_t width = 30;
  const double frac = (cell_ + std::min<double>(1.0, static_cast<double>(ticks_) / workers_) / 4) / cells_;
  const size_t fill = static_cast<size_t>(frac * width);
  std::fprintf(stderr, "\r[%s%s] %3.0f%% cell %zu/%zu %-28s %-12s %zu/%zu workers %6.1f s ",
               std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), 100 * frac,
               cell_ + 1, cells_, label_.c_str(), phase_.c_str(), ticks_, workers_, Since(start_));
  std::fflush(stderr);
}

void Progress::Done() {
  if (tty_) std::fprintf(stderr, "\n");
  std::fprintf(stderr, "tqkv-bench restore: done in %.1f s\n", Since(start_));
}

void Touch(KvCache& cache) {
  for (uint32_t l = 0; l < cache.geometry().layers; ++l) {
    std::memset(cache.k(l), 0, cache.tensor_bytes());
    std::memset(cache.v(l), 0, cache.tensor_bytes());
  }
}

Status CheckLayer(uint32_t layer, const void* k, const void* v) {
  // fp16 tensors: a NaN or inf has all exponent bits set.
  for (const void* t : {k, v}) {
    const auto* h = static_cast<const uint16_t*>(t);
    if ((h[0] & 0x7C00u) == 0x7C00u) {
      return Status::Corruption("restored layer " + std::to_string(layer) + " is not finite");
    }
  }
  return Status::Ok();
}

Status CopyObject(Store& from, Store& to, const std::string& key) {
  TQKV_ASSIGN_OR_RETURN(auto in, from.Open(key));
  TQKV_ASSIGN_OR_RETURN(auto out, to.Create(key));
  AlignedBuffer buf(8u << 20);
  for (uint64_t off = 0; off < in->Size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), in->Size() - off));
    TQKV_RETURN_IF_ERROR(in->ReadAt(off, {buf.data(), n}));
    TQKV_RETURN_IF_ERROR(out->Append({buf.data(), n}));
    off += n;
  }
  return out->Commit();
}

Result<Quality> MeasureQuality(Store& store, const std::string& key, const std::string& model,
                               const ModelGeometry& g, uint64_t tokens, uint64_t seed,
                               uint64_t tokens_compared) {
  auto source = MakeSyntheticSource(model, g, DType::kF16, tokens, seed);
  const size_t elems = tokens * g.token_elems();
  std::vector<uint16_t> k(elems), v(elems);
  double err = 0, ref = 0, cos_sum = 0;
  uint64_t vectors = 0;
  RestoreOptions ro;
  ro.dtype = DType::kF16;
  const size_t compare = tokens_compared * g.token_elems();
  TQKV_RETURN_IF_ERROR(RestoreStreaming(
      store, key, ro,
      [&](uint32_t layer, const void* rk, const void* rv) -> Status {
        TQKV_RETURN_IF_ERROR(source->ReadLayer(layer, k.data(), v.data()));
        for (int kv = 0; kv < 2; ++kv) {
          const uint16_t* a = kv ? v.data() : k.data();
          const auto* b = static_cast<const uint16_t*>(kv ? rv : rk);
          for (size_t i = 0; i < compare; i += g.head_dim) {
            double dot = 0, na = 0, nb = 0;
            for (size_t j = 0; j < g.head_dim; ++j) {
              const double x = HalfToFloat(a[i + j]), y = HalfToFloat(b[i + j]);
              dot += x * y;
              na += x * x;
              nb += y * y;
              err += (x - y) * (x - y);
            }
            ref += na;
            cos_sum += (na > 0 && nb > 0) ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0);
            ++vectors;
          }
        }
        return Status::Ok();
      }));
  Quality q;
  q.nmse = ref > 0 ? err / ref : 0;
  q.cosine_mean = vectors ? cos_sum / vectors : 0;
  return q;
}

uint64_t AvailableMemory() {
  std::ifstream f("/proc/meminfo");
  std::string name;
  uint64_t kb = 0;
  std::string unit;
  while (f >> name >> kb >> unit) {
    if (name == "MemAvailable:") return kb * 1024;
  }
  return 4ull << 30;
}

Status CheckDiskSpace(const Store& store, uint64_t bytes) {
  const std::optional<std::string> dir = store.LocalRoot();
  if (!dir) return Status::Ok();  // no local files: nothing to measure
  struct statvfs st;
  if (statvfs(dir->c_str(), &st) != 0) return Status::FromErrno("statvfs", *dir, errno);
  const uint64_t free = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  if (free < bytes) {
    return Status::NoSpace(*dir + ": " + std::to_string(free / 1000000) + " MB free, the largest "
                           "cell needs about " + std::to_string(bytes / 1000000) + " MB");
  }
  return Status::Ok();
}

std::string MachineDescription() {
  std::string cpu = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return cpu + ", " + std::to_string(std::thread::hardware_concurrency()) + " hw threads, " +
         std::to_string(AvailableMemory() >> 30) + " GiB available";
}

}  // namespace tqkv::bench
