// Row configs of `tqkv-bench restore` (codec x io x target) and the JSON fields of GPU rows.
#include "bench/restore_bench_rows.h"

#include <algorithm>

#include "tqkv/codec.h"
#include "tqkv/store.h"

namespace tqkv::bench {
namespace {

bool IsIoName(std::string_view io) {
  return io == "gds" || io == "direct" || io == "uring" || io == "buffered";
}

Status CheckIo(const RowConfig& r) {
  if (r.target == Target::kHost && r.io == "gds") {
    return Status::InvalidArgument(
        "gds reads into GPU memory: ask for a GPU row (CODEC:gds:gpu or --target gpu)");
  }
  if (r.target == Target::kHost) return ParseIoMode(r.io).status();
  if (IsIoName(r.io)) return Status::Ok();
  return Status::InvalidArgument("unknown GPU I/O path '" + r.io +
                                 "' (gds, direct, uring or buffered)");
}

Status CheckRow(const RowConfig& r) {
  TQKV_RETURN_IF_ERROR(ParseKvCodecSpec(r.codec).status());
  return CheckIo(r);
}

double Mean(const std::vector<GpuWorker>& ws, double GpuWorker::*field) {
  if (ws.empty()) return 0;
  double s = 0;
  for (const GpuWorker& w : ws) s += w.*field;
  return s / ws.size();
}

}  // namespace

std::string_view TargetName(Target t) { return t == Target::kGpu ? "gpu" : "host"; }

Result<Target> ParseTarget(std::string_view name) {
  if (name == "host") return Target::kHost;
  if (name == "gpu") return Target::kGpu;
  return Status::InvalidArgument("unknown target '" + std::string(name) + "' (host or gpu)");
}

Result<std::vector<RowConfig>> ExpandRowConfigs(const std::vector<std::string>& configs,
                                                const std::vector<std::string>& codecs,
                                                const std::vector<std::string>& ios,
                                                const std::vector<std::string>& target_names) {
  std::vector<Target> targets;
  for (const std::string& t : target_names) {
    TQKV_ASSIGN_OR_RETURN(Target tt, ParseTarget(t));
    if (std::find(targets.begin(), targets.end(), tt) == targets.end()) targets.push_back(tt);
  }
  if (targets.empty()) targets = {Target::kHost};
  std::vector<RowConfig> rows;
  for (const std::string& cfg : configs) {
    std::string rest = cfg;
    std::vector<Target> row_targets = targets;
    const size_t last = rest.rfind(':');
    if (last != std::string::npos && rest.find(':') != last) {
      Result<Target> t = ParseTarget(std::string_view(rest).substr(last + 1));
      if (t.ok()) {
        row_targets = {*t};
        rest.resize(last);
      } else if (!IsIoName(rest.substr(last + 1))) {
        return Status::InvalidArgument("--config " + cfg + ": '" + rest.substr(last + 1) +
                                       "' is neither a target (host, gpu) nor an I/O path");
      }
    }
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) {
      return Status::InvalidArgument("--config " + cfg + ": want CODEC:IO or CODEC:IO:TARGET");
    }
    for (Target t : row_targets) {
      RowConfig r{rest.substr(0, colon), rest.substr(colon + 1), t};
      Status st = CheckRow(r);
      if (!st.ok()) return Status(st.code(), "--config " + cfg + ": " + st.message());
      rows.push_back(r);
    }
  }
  if (!configs.empty()) return rows;
  for (const std::string& codec : codecs) {
    for (const std::string& io : ios) {
      for (Target t : targets) {
        RowConfig r{codec, io, t};
        TQKV_RETURN_IF_ERROR(CheckRow(r));
        rows.push_back(r);
      }
    }
  }
  return rows;
}

std::string ForcedGpuIo(const RowConfig& row) { return row.io == "gds" ? "" : row.io; }

Result<std::vector<RowConfig>> DropGpuRows(std::vector<RowConfig> rows,
                                           const std::string& gpu_unavailable, std::string* note) {
  note->clear();
  if (gpu_unavailable.empty()) return rows;
  const size_t before = rows.size();
  std::erase_if(rows, [](const RowConfig& r) { return r.target == Target::kGpu; });
  if (rows.size() == before) return rows;
  if (rows.empty()) {
    return Status::InvalidArgument("only GPU rows were asked for and no GPU restore is possible: " +
                                   gpu_unavailable);
  }
  *note = "skipping " + std::to_string(before - rows.size()) + " GPU row(s): " + gpu_unavailable;
  return rows;
}

nlohmann::json GpuRowJson(const std::vector<GpuWorker>& workers, const std::string& device) {
  std::vector<std::string> used, skipped;
  std::string host_io;
  for (const GpuWorker& w : workers) {
    if (std::find(used.begin(), used.end(), w.io_used) == used.end()) used.push_back(w.io_used);
    for (const std::string& s : w.skipped) {
      if (std::find(skipped.begin(), skipped.end(), s) == skipped.end()) skipped.push_back(s);
    }
    if (host_io.empty()) host_io = w.host_io;
  }
  std::string io_used;
  for (const std::string& u : used) io_used += (io_used.empty() ? "" : ",") + u;
  double first_max = 0;
  for (const GpuWorker& w : workers) first_max = std::max(first_max, w.first_layer_s);
  return {{"io_used", io_used},
          {"host_io", host_io},
          {"io_skipped", skipped},
          {"gpu_device", device},
          {"first_layer_s_mean", Mean(workers, &GpuWorker::first_layer_s)},
          {"first_layer_s_max", first_max},
          {"decode_gpu_s_mean", Mean(workers, &GpuWorker::decode_gpu_s)},
          {"copy_gpu_s_mean", Mean(workers, &GpuWorker::copy_gpu_s)},
          {"read_busy_s_mean", Mean(workers, &GpuWorker::read_busy_s)},
          {"setup_s_mean", Mean(workers, &GpuWorker::setup_s)}};
}

nlohmann::json GpuWorkerJson(const GpuWorker& w) {
  return {{"io_used", w.io_used},         {"host_io", w.host_io},
          {"first_layer_s", w.first_layer_s}, {"decode_gpu_s", w.decode_gpu_s},
          {"copy_gpu_s", w.copy_gpu_s},   {"read_busy_s", w.read_busy_s},
          {"setup_s", w.setup_s}};
}

}  // namespace tqkv::bench
