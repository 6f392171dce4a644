// Store-wide pieces: key validation, io modes, URI parsing and the scheme registry of OpenStore.
#include "tqkv/store.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "store/file_layout.h"
#include "store/posix/posix_store.h"
#ifdef TQKV_HAVE_REDIS
#include "store/redis/redis_store.h"
#endif
#ifdef TQKV_HAVE_NFS
#include "store/nfs/nfs_store.h"
#endif
#ifdef TQKV_HAVE_S3
#include "store/s3/s3_store.h"
#endif
#include "store/store_internal.h"
#include "tqkv/memory_store.h"
#include "tqkv/units.h"

namespace tqkv {

namespace {

constexpr size_t kMaxKeyBytes = 200;

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// Quoted for messages; odd bytes escaped so a NUL or newline cannot garble a log line.
std::string Printable(std::string_view s) {
  std::string out = "\"";
  for (char c : s.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out.push_back(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[(static_cast<unsigned char>(c) >> 4) & 0xf]);
      out.push_back(kHex[static_cast<unsigned char>(c) & 0xf]);
    }
  }
  if (s.size() > 64) out += "...";
  out += "\"";
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view s, std::string_view what) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size() || HexValue(s[i + 1]) < 0 || HexValue(s[i + 2]) < 0) {
      return Status::InvalidArgument("bad percent-escape in store URI " + std::string(what) +
                                     " " + Printable(s));
    }
    const char c = static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
    if (c == '\0') {
      return Status::InvalidArgument("NUL byte in store URI " + std::string(what));
    }
    out.push_back(c);
    i += 2;
  }
  return out;
}

Status ParseQuery(std::string_view query, StoreUri* uri) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string_view::npos) amp = query.size();
    std::string_view item = query.substr(pos, amp - pos);
    pos = amp + 1;
    if (item.empty()) {
      if (amp == query.size()) break;
      continue;
    }
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return Status::InvalidArgument("store URI option " + Printable(item) +
                                     " is not of the form key=value");
    }
    TQKV_ASSIGN_OR_RETURN(std::string key, PercentDecode(item.substr(0, eq), "option"));
    TQKV_ASSIGN_OR_RETURN(std::string value, PercentDecode(item.substr(eq + 1), "option"));
    for (const auto& kv : uri->options) {
      if (kv.first == key) {
        return Status::InvalidArgument("store URI option " + Printable(key) + " given twice");
      }
    }
    uri->options.emplace_back(std::move(key), std::move(value));
  }
  return Status::Ok();
}

std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

bool IsSchemeName(std::string_view s) {
  if (s.empty() || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '+' || c == '-' || c == '.';
  });
}

Result<std::unique_ptr<Store>> OpenMemoryStoreFromUri(const StoreUri& uri) {
  if (!uri.authority.empty() || !(uri.path.empty() || uri.path == "/")) {
    return Status::InvalidArgument("memory:// takes no host or path, got " +
                                   Printable(uri.authority + uri.path));
  }
  store_internal::UriOptions opts(uri);
  TQKV_RETURN_IF_ERROR(opts.Finish());
  return std::unique_ptr<Store>(std::make_unique<MemoryStore>());
}

struct Registry {
  std::mutex mu;
  std::map<std::string, StoreFactory, std::less<>> factories;
};

// Built-ins are listed here explicitly (static registrars get dropped from static libraries).
// Optional backends add their line behind their TQKV_HAVE_* macro.
Registry& GetRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry;
    r->factories.emplace("file", OpenPosixStoreFromUri);
    r->factories.emplace("memory", OpenMemoryStoreFromUri);
#ifdef TQKV_HAVE_REDIS
    r->factories.emplace("redis", OpenRedisStoreFromUri);
    r->factories.emplace("redis+unix", OpenRedisStoreFromUri);
    r->factories.emplace("redis+cluster", OpenRedisStoreFromUri);
#endif
#ifdef TQKV_HAVE_NFS
    r->factories.emplace("nfs", OpenNfsStoreFromUri);
#endif
#ifdef TQKV_HAVE_S3
    r->factories.emplace("s3", OpenS3StoreFromUri);
#endif
    return r;
  }();
  return *registry;
}

}  // namespace

std::string_view IoModeName(IoMode mode) {
  switch (mode) {
    case IoMode::kBuffered: return "buffered";
    case IoMode::kDirect: return "direct";
    case IoMode::kUring: return "uring";
  }
  return "unknown";
}

Result<IoMode> ParseIoMode(std::string_view name) {
  if (name == "buffered") return IoMode::kBuffered;
  if (name == "direct") return IoMode::kDirect;
  if (name == "uring") return IoMode::kUring;
  return Status::InvalidArgument("unknown io mode " + Printable(name) +
                                 " (expected buffered, direct or uring)");
}

Status ValidateKey(std::string_view key) {
  if (key.empty()) return Status::InvalidArgument("empty object key");
  if (key.size() > kMaxKeyBytes) {
    return Status::InvalidArgument("object key " + Printable(key) + " is " +
                                   std::to_string(key.size()) + " bytes, more than " +
                                   std::to_string(kMaxKeyBytes));
  }
  for (size_t i = 0; i < key.size(); ++i) {
    const char c = key[i];
    if (c != '/' && !IsKeyChar(c)) {
      return Status::InvalidArgument("object key " + Printable(key) + " has a byte outside " +
                                     "[A-Za-z0-9._-/] at position " + std::to_string(i));
    }
  }
  if (key.front() == '/') {
    return Status::InvalidArgument("object key " + Printable(key) + " is an absolute path");
  }
  size_t begin = 0;
  while (true) {
    size_t end = key.find('/', begin);
    const bool last = end == std::string_view::npos;
    if (last) end = key.size();
    std::string_view seg = key.substr(begin, end - begin);
    if (seg.empty()) {
      return Status::InvalidArgument("object key " + Printable(key) + " has an empty segment");
    }
    if (seg == "." || seg == "..") {
      return Status::InvalidArgument("object key " + Printable(key) + " has a \"" +
                                     std::string(seg) + "\" segment");
    }
    if (last) break;
    begin = end + 1;
  }
  // The stores' own names (store/file_layout.h) all have ".tqkv" inside; an object's file name
  // has it only at the end, so the two can never be taken for each other.
  const std::string_view suffix = store_internal::kObjectSuffix;
  const size_t at = key.find(suffix);
  if (at != std::string_view::npos && at + suffix.size() != key.size()) {
    return Status::InvalidArgument(
        "object key " + Printable(key) + " has \".tqkv\" at position " + std::to_string(at) +
        ": it may only end a key (names with \".tqkv\" inside, such as \".tqkv.tmp.\", "
        "\".tqkv.pin\" and \".tqkv-probe.\", are reserved for the store's own files)");
  }
  return Status::Ok();
}

Result<StoreUri> ParseStoreUri(std::string_view text) {
  if (text.empty()) return Status::InvalidArgument("empty store URI");
  if (text.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("NUL byte in store URI");
  }
  StoreUri uri;
  std::string_view rest;
  const size_t sep = text.find("://");
  const bool has_scheme = sep != std::string_view::npos && IsSchemeName(text.substr(0, sep)) &&
                          text.substr(0, sep).find('/') == std::string_view::npos;
  if (has_scheme) {
    uri.scheme = ToLower(text.substr(0, sep));
    rest = text.substr(sep + 3);
  } else {
    uri.scheme = "file";
    rest = text;
  }
  std::string_view query;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (has_scheme) {
    const size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    TQKV_ASSIGN_OR_RETURN(uri.authority, PercentDecode(authority, "host"));
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  }
  TQKV_ASSIGN_OR_RETURN(uri.path, PercentDecode(rest, "path"));
  TQKV_RETURN_IF_ERROR(ParseQuery(query, &uri));
  if (uri.scheme == "file") {
    if (!uri.authority.empty() && uri.authority != "localhost") {
      return Status::InvalidArgument("file:// URI names host " + Printable(uri.authority) +
                                     "; only local paths are supported (mount NFS and use "
                                     "file:///mount/point)");
    }
    uri.authority.clear();
    if (uri.path.empty()) return Status::InvalidArgument("store URI " + Printable(text) +
                                                         " has no directory");
  }
  return uri;
}

Status RegisterStoreScheme(std::string_view scheme, StoreFactory factory) {
  if (!IsSchemeName(scheme)) {
    return Status::InvalidArgument("bad store scheme name " + Printable(scheme));
  }
  if (!factory) return Status::InvalidArgument("null factory for scheme " + Printable(scheme));
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto [it, inserted] = r.factories.emplace(ToLower(scheme), std::move(factory));
  if (!inserted) {
    return Status::AlreadyExists("store scheme " + Printable(scheme) + " is already registered");
  }
  return Status::Ok();
}

namespace {

// Sets option `key` of `uri` to `value`, replacing the URI's own.
void SetOption(StoreUri& uri, std::string_view key, std::string value) {
  for (auto& kv : uri.options) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  uri.options.emplace_back(std::string(key), std::move(value));
}

Result<std::unique_ptr<Store>> OpenParsed(std::string_view uri_text, StoreUri uri,
                                          const OpenStoreOptions& options, bool existing) {
  if (options.io) SetOption(uri, "io", std::string(IoModeName(*options.io)));
  // Only the directory-backed schemes create anything at open.
  if (existing && (uri.scheme == "file" || uri.scheme == "nfs")) SetOption(uri, "create", "0");
  StoreFactory factory;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(uri.scheme);
    if (it == r.factories.end()) {
      std::string known;
      for (const auto& kv : r.factories) known += (known.empty() ? "" : ", ") + kv.first;
      return Status::InvalidArgument("unknown store scheme " + Printable(uri.scheme) +
                                     " in " + Printable(uri_text) + " (known: " + known + ")");
    }
    factory = it->second;
  }
  auto store = factory(uri);
  if (!store.ok()) return store.status().WithContext("opening store " + std::string(uri_text));
  return store;
}

}  // namespace

Result<std::unique_ptr<Store>> OpenStore(std::string_view uri_text,
                                         const OpenStoreOptions& options) {
  TQKV_ASSIGN_OR_RETURN(StoreUri uri, ParseStoreUri(uri_text));
  return OpenParsed(uri_text, std::move(uri), options, false);
}

Result<std::unique_ptr<Store>> OpenExistingStore(std::string_view uri_text,
                                                 const OpenStoreOptions& options) {
  TQKV_ASSIGN_OR_RETURN(StoreUri uri, ParseStoreUri(uri_text));
  return OpenParsed(uri_text, std::move(uri), options, true);
}

namespace store_internal {

bool CouldPrefixAKey(std::string_view prefix) {
  for (char c : prefix) {
    if (c != '/' && !IsKeyChar(c)) return false;
  }
  return true;
}

const std::string* UriOptions::Find(std::string_view key) {
  for (size_t i = 0; i < uri_.options.size(); ++i) {
    if (uri_.options[i].first == key) {
      used_[i] = true;
      return &uri_.options[i].second;
    }
  }
  return nullptr;
}

namespace {

Status BadOption(std::string_view key, const std::string& value, const char* kind, uint64_t min,
                 uint64_t max, const Status& why) {
  return Status::InvalidArgument("store URI option " + std::string(key) + "=" + Printable(value) +
                                 ": expected " + kind + " in [" + std::to_string(min) + ", " +
                                 std::to_string(max) + "]: " + why.message());
}

}  // namespace

Status UriOptions::GetCount(std::string_view key, uint64_t min, uint64_t max, uint64_t* value) {
  const std::string* v = Find(key);
  if (v == nullptr) return Status::Ok();
  auto parsed = ParseCount(*v, min, max);  // tqkv/units.h: the one unit rule
  if (!parsed.ok()) return BadOption(key, *v, "a count", min, max, parsed.status());
  *value = *parsed;
  return Status::Ok();
}

Status UriOptions::GetBytes(std::string_view key, uint64_t min, uint64_t max, uint64_t* value) {
  const std::string* v = Find(key);
  if (v == nullptr) return Status::Ok();
  auto parsed = ParseByteSize(*v, min, max);
  if (!parsed.ok()) return BadOption(key, *v, "a byte size", min, max, parsed.status());
  *value = *parsed;
  return Status::Ok();
}

Status UriOptions::GetSeconds(std::string_view key, uint64_t min, uint64_t max, uint64_t* value) {
  const std::string* v = Find(key);
  if (v == nullptr) return Status::Ok();
  auto parsed = ParseDuration(*v);
  Status why = parsed.status();
  if (parsed.ok()) {
    const int64_t ns = parsed->count();
    if (ns % 1'000'000'000 != 0) {
      why = Status::InvalidArgument("not a whole number of seconds");
    } else if (static_cast<uint64_t>(ns / 1'000'000'000) < min ||
               static_cast<uint64_t>(ns / 1'000'000'000) > max) {
      why = Status::InvalidArgument("out of range");
    } else {
      *value = static_cast<uint64_t>(ns / 1'000'000'000);
      return Status::Ok();
    }
  }
  return BadOption(key, *v, "seconds", min, max, why);
}

Status UriOptions::GetBool(std::string_view key, bool* value) {
  const std::string* v = Find(key);
  if (v == nullptr) return Status::Ok();
  if (*v == "1" || *v == "true") {
    *value = true;
  } else if (*v == "0" || *v == "false") {
    *value = false;
  } else {
    return Status::InvalidArgument("store URI option " + std::string(key) + "=" + Printable(*v) +
                                   ": expected 0 or 1");
  }
  return Status::Ok();
}

Status UriOptions::Finish() const {
  for (size_t i = 0; i < used_.size(); ++i) {
    if (!used_[i]) {
      return Status::InvalidArgument("unknown store URI option " +
                                     Printable(uri_.options[i].first) + " for scheme " +
                                     uri_.scheme);
    }
  }
  return Status::Ok();
}

int64_t NowUnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace store_internal

}  // namespace tqkv
