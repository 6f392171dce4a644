#include "cli/cli_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "format/container_layout.h"
#include "store/file_layout.h"

namespace tqkv::tools {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Whether the regular file at `path` begins with the container magic.
bool StartsWithContainerMagic(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f.fd < 0) return false;
  std::array<uint8_t, format::kMagic.size()> head{};
  return ::pread(f.fd, head.data(), head.size(), 0) == static_cast<ssize_t>(head.size()) &&
         head == format::kMagic;
}

}  // namespace

Status CheckOutputPath(const std::string& path, const std::vector<std::string>& inputs) {
  if (path.empty()) return Status::InvalidArgument("empty output file name");
  const std::string name = std::filesystem::path(path).filename().string();
  if (store_internal::ClassifyFileName(name) != store_internal::FileKind::kOther) {
    return Status::InvalidArgument(
        path + ": refusing to write here: names with \".tqkv\" in them are a store's sessions "
               "and its own files (docs/store.md §2); choose another output name");
  }
  struct stat out {};
  if (::stat(path.c_str(), &out) != 0) return Status::Ok();  // a new file
  if (S_ISDIR(out.st_mode)) return Status::InvalidArgument(path + ": is a directory");
  for (const std::string& in : inputs) {
    struct stat s {};
    if (::stat(in.c_str(), &s) == 0 && SameFile(s, out)) {
      return Status::InvalidArgument(path + ": refusing to write over the command's own input " +
                                     in);
    }
  }
  if (S_ISREG(out.st_mode) && StartsWithContainerMagic(path)) {
    return Status::InvalidArgument(path + ": refusing to write over a .tqkv session (it starts "
                                          "with the container magic); choose another output name");
  }
  return Status::Ok();
}

Status WriteOutputFile(const std::string& path, std::string_view bytes,
                       const std::vector<std::string>& inputs) {
  TQKV_RETURN_IF_ERROR(CheckOutputPath(path, inputs));
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string tmp =
      (dir / ("." + p.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f.fd < 0) return Status::FromErrno("create", tmp, errno);
  Status s;
  for (size_t done = 0; s.ok() && done < bytes.size();) {
    const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      s = Status::FromErrno("write", tmp, n < 0 ? errno : ENOSPC);
    } else {
      done += static_cast<size_t>(n);
    }
  }
  if (s.ok() && ::fsync(f.fd) != 0) s = Status::FromErrno("fsync", tmp, errno);
  if (s.ok() && ::close(f.fd) != 0) s = Status::FromErrno("close", tmp, errno);
  f.fd = -1;
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = Status::FromErrno("rename to " + path, tmp, errno);
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

Result<std::vector<uint8_t>> ReadInputFile(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f.fd < 0) return Status::FromErrno("open", path, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return Status::FromErrno("stat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(
        path + ": not a regular file (" + (S_ISDIR(st.st_mode) ? "a directory" : "a pipe or device") +
        "): give a file, whose size bounds what is read");
  }
  std::vector<uint8_t> b;
  try {
    b.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(path + ": " + std::to_string(st.st_size) +
                                     " bytes do not fit in memory");
  }
  for (size_t done = 0; done < b.size();) {
    const ssize_t n = ::pread(f.fd, b.data() + done, b.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("read", path, errno);
    if (n == 0) return Status::IoError(path + ": shrank while being read");
    done += static_cast<size_t>(n);
  }
  return b;
}

}  // namespace tqkv::tools
