#include "bench/restore_bench_report.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

namespace tqkv::bench {

std::string Cell::bottleneck() const {
  if (!has_breakdown()) return "";
  if (std::isnan(decode_capacity_fp16_gbps) || ratio() * read_only_gbps <= decode_capacity_fp16_gbps) {
    return link_gbps > 0 ? "link" : "disk";
  }
  return "CPU";
}

std::string LinkLabel(double link_gbps) {
  if (link_gbps <= 0) return "raw disk";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g GB/s link per worker", link_gbps);
  return buf;
}

namespace {

std::string Rate(double gbps, double s) {
  if (std::isnan(gbps)) return "         -       ";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%6.3f (%6.2f s)", gbps, s);
  return buf;
}

std::string Name(const Cell& c) { return c.codec + "+" + c.io; }

}  // namespace

void PrintBreakdown(const std::vector<Cell>& cells) {
  bool any = false;
  for (const Cell& c : cells) any = any || c.has_breakdown();
  if (!any) return;
  std::printf("\nStages, measured one by one in this run on the same objects with the restore's "
              "own reader (all workers together):\n");
  std::printf("%-8s %-8s %7s %-12s | %-17s | %-17s | %-17s | %-17s | %8s %8s | %7s %-5s\n", "codec",
              "io", "tokens", "link", "raw read GB/s", "+checksum GB/s", "decode fp16eq", "restore fp16eq",
              "bound", "achieved", "overlap", "limit");
  for (const Cell& c : cells) {
    if (!c.has_breakdown()) continue;
    char link[32] = "raw";
    if (c.link_gbps > 0) std::snprintf(link, sizeof(link), "%g GB/s", c.link_gbps);
    std::printf("%-8s %-8s %7llu %-12s | %s | %s | %s | %s | %8.3f %7.0f%% | %6.2fx %-5s\n",
                c.codec.c_str(), c.io.c_str(), static_cast<unsigned long long>(c.tokens),
                link,
                Rate(c.raw_read_gbps, c.raw_read_s).c_str(),
                Rate(c.read_only_gbps, c.read_only_s).c_str(),
                Rate(c.decode_capacity_fp16_gbps, c.decode_only_s).c_str(),
                Rate(c.fp16_gbps_aggregate, c.wall_s).c_str(), c.bound_fp16_gbps,
                100 * c.fp16_gbps_aggregate / c.bound_fp16_gbps, c.overlap(), c.bottleneck().c_str());
  }
  std::printf("raw read = chunks read and dropped; +checksum = read and verified as the restore "
              "does (no decode); decode = the same chunks restored from memory, less the copy out of "
              "memory (timed alone: an O_DIRECT restore's DMA does not cost it); bound = min(size "
              "ratio x checksummed-read GB/s, decode GB/s) in fp16-eq; achieved = restore / bound; "
              "overlap = restore wall / max(checksummed read, decode) wall (1.00 = stages fully "
              "overlapped, 2.00 = run one after the other).\n");
}

void PrintSummary(const std::vector<Cell>& cells) {
  // (link, tokens) in the order the cells ran.
  std::vector<std::pair<double, uint64_t>> groups;
  for (const Cell& c : cells) {
    if (c.target != Target::kHost) continue;
    const std::pair<double, uint64_t> g{c.link_gbps, c.tokens};
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  std::sort(groups.begin(), groups.end());
  bool header = false;
  double last_link = -1;
  for (const auto& [link, tokens] : groups) {
    const Cell* fp16 = nullptr;
    std::vector<const Cell*> tq;
    for (const Cell& c : cells) {
      if (c.target != Target::kHost || c.link_gbps != link || c.tokens != tokens) continue;
      if (c.codec == "fp16") {
        if (fp16 == nullptr || c.restore.mean < fp16->restore.mean) fp16 = &c;
      } else {
        tq.push_back(&c);
      }
    }
    if (fp16 == nullptr || tq.empty()) continue;
    if (!header) {
      std::printf("\nSummary (restore time per session, %zu workers at once; fp16 = its fastest "
                  "I/O path):\n", fp16->workers);
      header = true;
    }
    if (link != last_link) {
      std::printf("%s:\n", LinkLabel(link).c_str());
      last_link = link;
    }
    for (const Cell* c : tq) {
      const double x = fp16->restore.mean / c->restore.mean;
      std::printf("  %6llu tokens: %s restores %.2fx %s than %s (%.2f s vs %.2f s)",
                  static_cast<unsigned long long>(tokens), Name(*c).c_str(), x >= 1 ? x : 1 / x,
                  x >= 1 ? "faster" : "slower", Name(*fp16).c_str(), c->restore.mean,
                  fp16->restore.mean);
      const std::string limit = c->bottleneck();
      const double reads = c->ratio() * c->read_only_gbps;
      if (limit == "CPU") {
        std::printf("; CPU-bound: decode %.2f GB/s fp16-eq < reads %.3f GB/s x %.2f = %.2f GB/s "
                    "fp16-eq\n", c->decode_capacity_fp16_gbps, c->read_only_gbps, c->ratio(), reads);
      } else if (!limit.empty() && !std::isnan(c->decode_capacity_fp16_gbps)) {
        std::printf("; %s-bound: reads %.3f GB/s x %.2f = %.2f GB/s fp16-eq < decode %.2f GB/s "
                    "fp16-eq (at best the size ratio, %.2fx)\n", limit.c_str(),
                    c->read_only_gbps, c->ratio(), reads, c->decode_capacity_fp16_gbps, c->ratio());
      } else if (!limit.empty()) {
        std::printf("; reads %.3f GB/s x %.2f = %.2f GB/s fp16-eq (decode not measured)\n",
                    c->read_only_gbps, c->ratio(), reads);
      } else {
        std::printf("\n");
      }
    }
  }
}

}  // namespace tqkv::bench
