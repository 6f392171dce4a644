#include "tqkv/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

namespace tqkv {
namespace {

using json = nlohmann::json;

std::string SafetensorsDType(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "";
}

std::optional<DType> ParseSafetensorsDType(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return std::nullopt;
}

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("write", path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status ReadAll(int fd, uint64_t offset, void* data, size_t n, const std::string& path) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("read", path, errno);
    }
    if (r == 0) return Status::Corruption(path + ": unexpected end of file at offset " +
                                          std::to_string(offset));
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Status WriteSafetensors(const KvCache& cache, const std::string& path) {
  TQKV_RETURN_IF_ERROR(cache.Validate());
  const auto& g = cache.geometry();
  json header = json::object();
  header["__metadata__"] = {{"format", "tqkv-kv-cache"}, {"model", cache.model()}};
  uint64_t offset = 0;
  for (uint32_t l = 0; l < g.layers; ++l) {
    const uint64_t bytes = cache.tensor_bytes(l);  // a ragged cache's layers differ
    for (const char* kv : {"k", "v"}) {
      header["layers." + std::to_string(l) + "." + kv] = {
          {"dtype", SafetensorsDType(cache.dtype())},
          {"shape", {cache.layer_tokens(l), g.kv_heads, g.head_dim}},
          {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
  }
  // The model name may not be UTF-8; invalid bytes become U+FFFD rather than an exception.
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  while ((8 + text.size()) % 8) text.push_back(' ');  // data starts 8-byte aligned
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) return Status::FromErrno("create", tmp, errno);
  uint8_t len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  Status s = WriteAll(f.fd, len, 8, tmp);
  if (s.ok()) s = WriteAll(f.fd, text.data(), text.size(), tmp);
  for (uint32_t l = 0; l < g.layers && s.ok(); ++l) {
    s = WriteAll(f.fd, cache.k(l), cache.tensor_bytes(l), tmp);
    if (s.ok()) s = WriteAll(f.fd, cache.v(l), cache.tensor_bytes(l), tmp);
  }
  if (s.ok() && ::fsync(f.fd) != 0) s = Status::FromErrno("fsync", tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = Status::FromErrno("rename", tmp, errno);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

Result<std::unique_ptr<KvCacheBuffer>> ReadSafetensors(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return Status::FromErrno("open", path, errno);
  struct stat st;
  if (::fstat(f.fd, &st) != 0) return Status::FromErrno("stat", path, errno);
  const uint64_t file = static_cast<uint64_t>(st.st_size);
  auto corrupt = [&](const std::string& why) { return Status::Corruption(path + ": " + why); };
  if (file < 8) return corrupt("shorter than the 8-byte header length");
  uint8_t len_bytes[8];
  TQKV_RETURN_IF_ERROR(ReadAll(f.fd, 0, len_bytes, 8, path));
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
  if (hlen > file - 8 || hlen > (100u << 20)) {
    return corrupt("header length " + std::to_string(hlen) + " exceeds the file");
  }
  std::string text(hlen, '\0');
  TQKV_RETURN_IF_ERROR(ReadAll(f.fd, 8, text.data(), hlen, path));
  json header = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return corrupt("header is not a JSON object");
  const uint64_t data_start = 8 + hlen;
  const uint64_t data_bytes = file - data_start;

  std::string model = "unknown";
  if (header.contains("__metadata__") && header["__metadata__"].is_object()) {
    const auto& m = header["__metadata__"];
    if (m.contains("model") && m["model"].is_string()) model = m["model"].get<std::string>();
  }
  struct Info {
    DType dtype;
    uint64_t shape[3];
    uint64_t begin, end;
  };
  std::map<std::pair<uint32_t, int>, Info> tensors;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    unsigned layer = 0;
    char kv = 0;
    int consumed = 0;
    if (std::sscanf(name.c_str(), "layers.%u.%c%n", &layer, &kv, &consumed) != 2 ||
        static_cast<size_t>(consumed) != name.size() || (kv != 'k' && kv != 'v') || layer > 100000) {
      return corrupt("unexpected tensor '" + name + "' (want layers.<i>.k / layers.<i>.v)");
    }
    const json& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || t["shape"].size() != 3 || !t.contains("data_offsets") ||
        !t["data_offsets"].is_array() || t["data_offsets"].size() != 2) {
      return corrupt("tensor '" + name + "' lacks dtype, a 3-d shape or data_offsets");
    }
    auto dtype = ParseSafetensorsDType(t["dtype"].get<std::string>());
    if (!dtype) return Status::Unsupported(path + ": tensor '" + name + "' dtype " +
                                           t["dtype"].get<std::string>());
    Info info{*dtype, {}, 0, 0};
    for (int i = 0; i < 3; ++i) {
      if (!t["shape"][i].is_number_unsigned()) return corrupt("tensor '" + name + "' shape");
      info.shape[i] = t["shape"][i].get<uint64_t>();
      if (info.shape[i] > (1ull << 32)) return corrupt("tensor '" + name + "' shape too large");
    }
    for (int i = 0; i < 2; ++i) {
      if (!t["data_offsets"][i].is_number_unsigned()) return corrupt("tensor '" + name + "' offsets");
    }
    info.begin = t["data_offsets"][0].get<uint64_t>();
    info.end = t["data_offsets"][1].get<uint64_t>();
    const unsigned __int128 want =
        static_cast<unsigned __int128>(info.shape[0]) * info.shape[1] * info.shape[2] * DTypeSize(info.dtype);
    if (info.begin > info.end || info.end > data_bytes || want != info.end - info.begin) {
      return corrupt("tensor '" + name + "' data range [" + std::to_string(info.begin) + ", " +
                     std::to_string(info.end) + ") does not fit its shape or the file");
    }
    tensors[{layer, kv == 'k' ? 0 : 1}] = info;
  }
  if (tensors.empty()) return corrupt("no layers.<i>.k / .v tensors");
  const uint32_t layers = static_cast<uint32_t>(tensors.size() / 2);
  const Info& first = tensors.begin()->second;
  ModelGeometry g{layers, static_cast<uint32_t>(first.shape[1]), static_cast<uint32_t>(first.shape[2])};
  if (g.kv_heads == 0 || g.head_dim == 0) return corrupt("empty KV heads or head_dim");
  // Layers may hold different token counts (a ragged session, as WriteSafetensors writes one);
  // a layer's K and V hold the same.
  std::vector<uint64_t> layer_tokens(layers);
  uint64_t tokens = 0;
  for (uint32_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      auto it = tensors.find({l, kv});
      if (it == tensors.end()) return corrupt("missing tensor layers." + std::to_string(l) +
                                              (kv ? ".v" : ".k"));
      const Info& i = it->second;
      if (i.dtype != first.dtype || i.shape[1] != first.shape[1] ||
          i.shape[2] != first.shape[2] || (kv == 1 && i.shape[0] != layer_tokens[l])) {
        return corrupt("tensor layers." + std::to_string(l) + (kv ? ".v" : ".k") +
                       " differs in dtype or shape from layers.0.k" +
                       (kv ? " (or from its K's tokens)" : ""));
      }
      layer_tokens[l] = i.shape[0];
      tokens = std::max(tokens, i.shape[0]);
    }
  }
  if (tokens > 0 && std::find(layer_tokens.begin(), layer_tokens.end(), 0) != layer_tokens.end()) {
    return corrupt("a layer without tokens beside layers with some");
  }
  if (tokens == 0) layer_tokens.clear();
  TQKV_ASSIGN_OR_RETURN(auto buf, KvCacheBuffer::Allocate(model, g, first.dtype, tokens,
                                                          std::move(layer_tokens)));
  for (uint32_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const Info& i = tensors[{l, kv}];
      TQKV_RETURN_IF_ERROR(ReadAll(f.fd, data_start + i.begin, buf->cache().tensor(l, kv),
                                   i.end - i.begin, path));
    }
  }
  return buf;
}

}  // namespace tqkv
