// Session admin on a posix store directory (posix_admin.h).
#include "store/posix/posix_admin.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "store/file_layout.h"

namespace tqkv {
namespace {

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
      if (store_internal::ClassifyFileName(name) != store_internal::FileKind::kObject) continue;
      struct stat st {};
      if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      const std::string rel = std::filesystem::relative(it->path().parent_path(), dir_, ec).string();
      const auto key = store_internal::KeyOfObjectFile(rel == "." ? "" : rel + "/", name);
      if (!key) continue;
      SessionMeta m;
      m.key = *key;
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
    const std::string object = ObjectPath(key);
    const std::string pin = store_internal::PinPath(object);
    if (until_ns == 0) {
      if (::unlink(pin.c_str()) != 0 && errno != ENOENT) return Status::FromErrno("unlink", pin, errno);
      return Status::Ok();
    }
    struct stat st {};
    if (::stat(object.c_str(), &st) != 0) {
      return Status::NotFound("no session " + std::string(key) + " in " + dir_);
    }
    // Written beside the object as a temp, so a writer killed here leaves what gc sweeps.
    const std::string tmp = store_internal::TempPath(object, "p");
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << until_ns << "\n";
      if (!f) {
        (void)::unlink(tmp.c_str());
        return Status::IoError("cannot write " + tmp);
      }
    }
    if (::rename(tmp.c_str(), pin.c_str()) != 0) {
      const int err = errno;
      (void)::unlink(tmp.c_str());
      return Status::FromErrno("rename", tmp, err);
    }
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
    const std::string aside = store_internal::TempPath(p, "gc");  // never listed, swept if left
    if (::rename(p.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) return Status::NotFound("no session " + key);
      return Status::FromErrno("rename", p, errno);
    }
    struct stat st {};
    if (::stat(aside.c_str(), &st) == 0 && Ns(st.st_mtim) == listed.mtime_ns &&
        (listed.version.empty() || listed.version == std::to_string(st.st_ino))) {
      if (::unlink(aside.c_str()) != 0) return Status::FromErrno("unlink", aside, errno);
      (void)::unlink(store_internal::PinPath(p).c_str());
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
  std::string ObjectPath(std::string_view key) const {
    return store_internal::ObjectPath(dir_, key);
  }
  int64_t ReadPin(std::string_view key) const {
    std::ifstream f(store_internal::PinPath(ObjectPath(key)));
    long long v = 0;
    if (!(f >> v)) return 0;
    return v;
  }

  std::string dir_;
};

}  // namespace

std::unique_ptr<SessionAdmin> MakePosixSessionAdmin(std::string dir) {
  return std::make_unique<PosixAdmin>(std::move(dir));
}

}  // namespace tqkv
