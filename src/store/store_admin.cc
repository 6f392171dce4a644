// Session admin: the posix side (files), dispatch to nfs/redis, and the garbage collector.
#include "store/store_admin.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "store/store_internal.h"

namespace tqkv {
namespace {

constexpr std::string_view kSuffix = ".tqkv";

bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

int64_t Ns(const timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; }

class PosixAdmin final : public SessionAdmin {
 public:
  explicit PosixAdmin(std::string dir) : dir_(std::move(dir)) {}

  Result<std::vector<SessionMeta>> ListSessions() override {
    std::vector<SessionMeta> out;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(dir_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!EndsWith(name, kSuffix) || (name[0] == '.' && name.find(".tqkv.tmp.") != std::string::npos)) {
        continue;
      }
      struct stat st {};
      if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      std::string rel = std::filesystem::relative(it->path(), dir_, ec).string();
      SessionMeta m;
      m.key = rel.substr(0, rel.size() - kSuffix.size());
      if (!ValidateKey(m.key).ok()) continue;
      m.size = static_cast<uint64_t>(st.st_size);
      m.mtime_ns = Ns(st.st_mtim);
      m.atime_ns = Ns(st.st_atim);
      m.version = std::to_string(st.st_ino);  // a republish is a new file (renamed temp)
      m.pin_until_ns = ReadPin(m.key);
      out.push_back(std::move(m));
    }
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return Status::IoError("listing " + dir_ + ": " + ec.message());
    }
    std::sort(out.begin(), out.end(),
              [](const SessionMeta& a, const SessionMeta& b) { return a.key < b.key; });
    return out;
  }

  Status SetPin(std::string_view key, int64_t until_ns) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const std::string pin = PinPath(key);
    if (until_ns == 0) {
      if (::unlink(pin.c_str()) != 0 && errno != ENOENT) return Status::FromErrno("unlink", pin, errno);
      return Status::Ok();
    }
    struct stat st {};
    if (::stat(ObjectPath(key).c_str(), &st) != 0) {
      return Status::NotFound("no session " + std::string(key) + " in " + dir_);
    }
    const std::string tmp = pin + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << until_ns << "\n";
      if (!f) return Status::IoError("cannot write " + tmp);
    }
    if (::rename(tmp.c_str(), pin.c_str()) != 0) return Status::FromErrno("rename", tmp, errno);
    return Status::Ok();
  }

  // The object is renamed aside first, then checked. The rename is atomic, so a version
  // published after it stays in place, and one published between the listing and the rename is
  // found aside and put back (link() never replaces an even newer one). Readers may miss the key
  // for that instant; a version gc did not examine is never deleted.
  Status RemoveIfUnchanged(const SessionMeta& listed) override {
    const std::string& key = listed.key;
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const std::string p = ObjectPath(key);
    const std::string aside = AsidePath(p);
    if (::rename(p.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) return Status::NotFound("no session " + key);
      return Status::FromErrno("rename", p, errno);
    }
    struct stat st {};
    if (::stat(aside.c_str(), &st) == 0 && Ns(st.st_mtim) == listed.mtime_ns &&
        (listed.version.empty() || listed.version == std::to_string(st.st_ino))) {
      if (::unlink(aside.c_str()) != 0) return Status::FromErrno("unlink", aside, errno);
      (void)::unlink(PinPath(key).c_str());
      return Status::Ok();
    }
    const Status kept = Status::Busy("session " + key + " was published again; kept");
    if (::link(aside.c_str(), p.c_str()) == 0 || errno == EEXIST) {
      (void)::unlink(aside.c_str());  // back in place, or older than the one there now
      return kept;
    }
    // No hard links on this file system: rename back.
    if (::rename(aside.c_str(), p.c_str()) != 0) return Status::FromErrno("rename", aside, errno);
    return kept;
  }

 private:
  // A temp name beside `path` (".<base>.tqkv.tmp.gc<pid>.<n>"): never listed, swept if left.
  static std::string AsidePath(const std::string& path) {
    static std::atomic<uint64_t> seq{0};
    const size_t slash = path.rfind('/');
    return path.substr(0, slash + 1) + "." + path.substr(slash + 1) + ".tmp.gc" +
           std::to_string(::getpid()) + "." + std::to_string(store_internal::NowUnixNs()) + "." +
           std::to_string(seq.fetch_add(1));
  }
  std::string ObjectPath(std::string_view key) const {
    return dir_ + "/" + std::string(key) + std::string(kSuffix);
  }
  std::string PinPath(std::string_view key) const {
    const std::string k(key);
    const size_t slash = k.rfind('/');
    const std::string base = slash == std::string::npos ? k : k.substr(slash + 1);
    const std::string parent = slash == std::string::npos ? "" : k.substr(0, slash + 1);
    return dir_ + "/" + parent + "." + base + ".tqkv.pin";
  }
  int64_t ReadPin(std::string_view key) const {
    std::ifstream f(PinPath(key));
    long long v = 0;
    if (!(f >> v)) return 0;
    return v;
  }

  std::string dir_;
};

// Forwards to a SessionAdmin the store object itself implements (nfs, redis).
class Forward final : public SessionAdmin {
 public:
  explicit Forward(SessionAdmin* a) : a_(a) {}
  Result<std::vector<SessionMeta>> ListSessions() override { return a_->ListSessions(); }
  Status SetPin(std::string_view key, int64_t until_ns) override { return a_->SetPin(key, until_ns); }
  Status RemoveIfUnchanged(const SessionMeta& listed) override {
    return a_->RemoveIfUnchanged(listed);
  }

 private:
  SessionAdmin* a_;
};

}  // namespace

Result<std::unique_ptr<SessionAdmin>> OpenSessionAdmin(Store* store) {
  if (auto* a = dynamic_cast<SessionAdmin*>(store)) {
    return std::unique_ptr<SessionAdmin>(std::make_unique<Forward>(a));
  }
  if (store->Name() == "posix") {
    TQKV_ASSIGN_OR_RETURN(StoreUri uri, ParseStoreUri(store->Uri()));
    return std::unique_ptr<SessionAdmin>(std::make_unique<PosixAdmin>(uri.path));
  }
  return Status::Unsupported("session management is not available for " +
                             std::string(store->Name()) + " stores (posix, nfs and redis have it)");
}

Result<GcReport> CollectGarbage(Store* store, const GcOptions& o) {
  GcReport rep;
  TQKV_ASSIGN_OR_RETURN(auto admin, OpenSessionAdmin(store));
  if (!o.dry_run) {
    TQKV_ASSIGN_OR_RETURN(rep.temps_removed, store->RemoveStaleTemps(o.temp_min_age));
  }
  TQKV_ASSIGN_OR_RETURN(std::vector<SessionMeta> sessions, admin->ListSessions());
  const int64_t now = store_internal::NowUnixNs();
  for (const auto& s : sessions) rep.bytes_before += s.size;
  uint64_t total = rep.bytes_before;
  // Least recently used first.
  std::sort(sessions.begin(), sessions.end(), [](const SessionMeta& a, const SessionMeta& b) {
    return a.LastUse() != b.LastUse() ? a.LastUse() < b.LastUse() : a.key < b.key;
  });
  auto remove = [&](const SessionMeta& s) -> Result<bool> {
    if (o.dry_run) return true;
    Status st = admin->RemoveIfUnchanged(s);
    if (st.ok()) return true;
    if (st.IsNotFound() || st.code() == StatusCode::kBusy) return false;  // raced: someone else
    return st;
  };
  const int64_t ttl_ns = static_cast<int64_t>(o.ttl.count()) * 1'000'000'000;
  std::vector<const SessionMeta*> live;
  for (const auto& s : sessions) {
    if (s.PinnedAt(now)) {
      rep.pinned_kept.push_back(s.key);
      continue;
    }
    if (ttl_ns > 0 && now - s.LastUse() > ttl_ns) {
      TQKV_ASSIGN_OR_RETURN(bool gone, remove(s));
      if (gone) {
        rep.expired.push_back(s);
        total -= s.size;
      }
      continue;
    }
    live.push_back(&s);
  }
  if (o.max_bytes > 0) {
    for (const SessionMeta* s : live) {
      if (total <= o.max_bytes) break;
      TQKV_ASSIGN_OR_RETURN(bool gone, remove(*s));
      if (gone) {
        rep.evicted.push_back(*s);
        total -= s->size;
      }
    }
    rep.over_cap_after = total > o.max_bytes;
  }
  rep.bytes_after = total;
  return rep;
}

}  // namespace tqkv
