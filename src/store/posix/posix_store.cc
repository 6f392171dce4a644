// POSIX directory store: buffered, O_DIRECT and io_uring I/O; atomic publish by rename.
#include "store/posix/posix_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/file_layout.h"
#include "store/posix/parallel_reads.h"
#include "store/posix/posix_admin.h"
#include "store/publishing_writer.h"
#include "store/store_internal.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/thread_pool.h"

#ifdef TQKV_HAVE_IO_URING
#include "store/posix/uring_reader.h"
#endif

namespace tqkv {
namespace {

constexpr uint64_t kAlign = kPosixDirectAlignment;
constexpr uint64_t kMaxSyscallBytes = 1ull << 30;  // Linux moves at most ~2 GiB per call
constexpr size_t kMaxPooledBounce = 4;
constexpr size_t kMaxPooledStaging = 4;

bool IsAligned(uint64_t x) { return x % kAlign == 0; }
bool IsAlignedPtr(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlign == 0; }
bool StartsWith(std::string_view s, std::string_view t) {
  return s.size() >= t.size() && s.substr(0, t.size()) == t;
}

std::string AtOffset(std::string_view what, uint64_t off) {
  return std::string(what) + " at offset " + std::to_string(off);
}

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("open directory", dir, errno);
  Status s;
  if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
    s = Status::FromErrno("fsync directory", dir, errno);
  }
  ::close(fd);
  return s;
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Further transfers on `fd` go through the page cache.
bool ClearDirectFlag(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  return fl >= 0 && ::fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0;
}

struct Shared {
  PosixStoreOptions opts;
  std::atomic<bool> direct_refused{false};
  std::atomic<bool> uring_refused{false};
  // Staging buffers of finished writers, reused so their pages are not faulted in again.
  std::mutex pool_mu;
  std::vector<AlignedBuffer> staging_pool;

  AlignedBuffer TakeStaging() {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (!staging_pool.empty()) {
        AlignedBuffer b = std::move(staging_pool.back());
        staging_pool.pop_back();
        return b;
      }
    }
    // 2 MiB alignment so MADV_HUGEPAGE can back the buffer with huge pages.
    constexpr size_t kHuge = 2u << 20;
    AlignedBuffer b(opts.write_buffer_bytes, kHuge);
    (void)madvise(b.data(), AlignUp(opts.write_buffer_bytes, kHuge), MADV_HUGEPAGE);
    return b;
  }
  void ReturnStaging(AlignedBuffer b) {
    if (b.size() < opts.write_buffer_bytes) return;
    std::lock_guard<std::mutex> lock(pool_mu);
    if (staging_pool.size() < kMaxPooledStaging) staging_pool.push_back(std::move(b));
  }

  std::string ObjectPath(std::string_view key) const {
    return store_internal::ObjectPath(opts.dir, key);
  }
  Status CheckKey(std::string_view key) const {
    if (!opts.file_names) return ValidateKey(key);
    const std::string shown(key.substr(0, key.find('\0')));
    if (key.empty() || key == "." || key == ".." ||
        key.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
      return Status::InvalidArgument("file name \"" + shown +
                                     "\" is empty, a directory or holds '/' or NUL");
    }
    // As for keys: ".tqkv" inside a name is the store's own files' (temps, pins, probes).
    const size_t at = key.find(store_internal::kObjectSuffix);
    if (at != std::string_view::npos && at + store_internal::kObjectSuffix.size() != key.size()) {
      return Status::InvalidArgument("file name \"" + shown +
                                     ".tqkv\" has \".tqkv\" inside: such names are reserved "
                                     "for a store's own files");
    }
    return Status::Ok();
  }
  bool WantDirect() const { return opts.io != IoMode::kBuffered && !direct_refused.load(); }
  bool UringEngine() const {
    return opts.io == IoMode::kUring || (opts.io == IoMode::kDirect && !opts.direct_threads);
  }
  bool WantUring() const { return UringEngine() && WantDirect() && !uring_refused; }
  IoMode EffectiveMode() const {
    if (opts.io == IoMode::kBuffered || direct_refused) return IoMode::kBuffered;
    if (opts.io == IoMode::kUring && uring_refused) return IoMode::kDirect;
    return opts.io;
  }
  // io=direct with qd > 1 (or uring that fell back): the pool of I/O threads, started on first
  // use; nullptr when reads stay on the caller's thread.
  ThreadPool* ReadPool() {
    if (opts.queue_depth <= 1) return nullptr;
    std::call_once(read_pool_once, [this] {
      read_pool = std::make_unique<ThreadPool>(
          std::min<size_t>(opts.queue_depth, posix_internal::kMaxReadThreads));
    });
    return read_pool.get();
  }
  std::once_flag read_pool_once;
  std::unique_ptr<ThreadPool> read_pool;

  // The filesystem refused O_DIRECT on `fd` (EINVAL): turn it off there and for new objects.
  bool DisableDirect(int fd) {
    direct_refused = true;
    return ClearDirectFlag(fd);
  }
};

// Opens with O_DIRECT when wanted, retrying without it when the filesystem says EINVAL.
int OpenMaybeDirect(Shared* sh, const std::string& path, int flags, mode_t mode, bool* direct) {
  *direct = sh->WantDirect();
  if (*direct) {
    const int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EINVAL) return fd;
    sh->direct_refused = true;
    *direct = false;
  }
  return ::open(path.c_str(), flags | O_CLOEXEC, mode);
}

// ---------------------------------------------------------------------------------------------
// Writer

class PosixWritable final : public store_internal::PublishingWriter {
 public:
  PosixWritable(std::shared_ptr<Shared> sh, std::string key, std::string final_path,
                std::string tmp_path, std::vector<std::string> dirs_to_sync, int fd, bool direct)
      : PublishingWriter("posix", std::move(key)),
        sh_(std::move(sh)),
        final_path_(std::move(final_path)),
        tmp_path_(std::move(tmp_path)),
        dirs_to_sync_(std::move(dirs_to_sync)),
        fd_(fd),
        direct_(direct) {}

  ~PosixWritable() override { DiscardIfUnfinished(); }

  uint64_t BytesWritten() const override { return size_; }

 private:
  Status AppendBytes(std::span<const uint8_t> src) override {
    const uint64_t cap = sh_->opts.write_buffer_bytes;
    while (!src.empty()) {
      // Large appends with an empty staging buffer go straight from the caller's memory.
      if (used_ == 0 && src.size() >= cap && (!direct_ || IsAlignedPtr(src.data()))) {
        const uint64_t n = direct_ ? AlignDown(src.size(), kAlign) : src.size();
        Status s = WriteAt(src.data(), n, flushed_);
        if (!s.ok()) return s;
        flushed_ += n;
        size_ += n;
        src = src.subspan(n);
        continue;
      }
      if (staging_.size() < cap) staging_ = sh_->TakeStaging();
      const uint64_t k = std::min<uint64_t>(cap - used_, src.size());
      std::memcpy(staging_.data() + used_, src.data(), k);
      used_ += k;
      size_ += k;
      src = src.subspan(k);
      if (used_ == cap) {
        Status s = WriteAt(staging_.data(), cap, flushed_);
        if (!s.ok()) return s;
        flushed_ += cap;
        used_ = 0;
      }
    }
    return Status::Ok();
  }

  // A crash: the temp file stays on disk, as after a real one.
  void Stop() override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  Status WriteAt(const uint8_t* p, uint64_t n, uint64_t off) {
    // Page-cache writes: start their write-back now, so the disk writes while the caller encodes
    // the next buffer and Commit's fdatasync waits only for the tail (best effort).
    if (!direct_ && n > 0) {
      const uint64_t start = off, len = n;
      TQKV_RETURN_IF_ERROR(WriteLoop(p, n, off));
      (void)::sync_file_range(fd_, static_cast<off_t>(start), static_cast<off_t>(len),
                              SYNC_FILE_RANGE_WRITE);
      return Status::Ok();
    }
    return WriteLoop(p, n, off);
  }

  Status WriteLoop(const uint8_t* p, uint64_t n, uint64_t off) {
    while (n > 0) {
      const uint64_t want = std::min(n, kMaxSyscallBytes);
      ssize_t w = ::pwrite(fd_, p, want, static_cast<off_t>(off));
      if (sh_->opts.simulate_short_io && w > 1) w /= 2;
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && direct_) {
          direct_ = false;
          if (sh_->DisableDirect(fd_)) continue;
        }
        return Status::FromErrno("write", AtOffset(key() + " (" + tmp_path_ + ")", off), errno);
      }
      if (w == 0) {
        return Status::IoError("write " + AtOffset(key() + " (" + tmp_path_ + ")", off) +
                               ": wrote nothing");
      }
      p += w;
      n -= static_cast<uint64_t>(w);
      off += static_cast<uint64_t>(w);
      // A short O_DIRECT write leaves an unaligned remainder: finish it through the page cache.
      if (direct_ && n > 0 && !IsAligned(static_cast<uint64_t>(w))) {
        direct_ = false;
        (void)ClearDirectFlag(fd_);
      }
    }
    return Status::Ok();
  }

  Status Publish() override {
    const std::string name = key() + " (" + tmp_path_ + ")";
    if (used_ > 0) {
      if (direct_) {
        const uint64_t padded = AlignUp(used_, kAlign);
        std::memset(staging_.data() + used_, 0, padded - used_);
        TQKV_RETURN_IF_ERROR(WriteAt(staging_.data(), padded, flushed_));
        if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
          return Status::FromErrno("ftruncate", AtOffset(name, size_), errno);
        }
      } else {
        TQKV_RETURN_IF_ERROR(WriteAt(staging_.data(), used_, flushed_));
      }
      flushed_ += used_;
      used_ = 0;
    }
    // mtime = publish time (List reports it); rename would keep the last write's time.
    (void)::futimens(fd_, nullptr);
    if (::fdatasync(fd_) != 0) return Status::FromErrno("fdatasync", name, errno);
    // NFS reports deferred write errors at close: check it.
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return Status::FromErrno("close", name, errno);
    if (::rename(tmp_path_.c_str(), final_path_.c_str()) != 0) {
      return Status::FromErrno("rename", tmp_path_ + " -> " + final_path_, errno);
    }
    for (const std::string& dir : dirs_to_sync_) {
      TQKV_RETURN_IF_ERROR(SyncDir(dir).WithContext("publishing " + key()));
    }
    ReleaseStaging();
    return Status::Ok();
  }

  void ReleaseStaging() {
    if (staging_.data() != nullptr) sh_->ReturnStaging(std::move(staging_));
    staging_ = AlignedBuffer();
    used_ = 0;
  }

  Status Discard() override {
    ReleaseStaging();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (::unlink(tmp_path_.c_str()) != 0 && errno != ENOENT) {
      return Status::FromErrno("unlink", tmp_path_, errno);
    }
    return Status::Ok();
  }

  std::shared_ptr<Shared> sh_;
  std::string final_path_;
  std::string tmp_path_;
  std::vector<std::string> dirs_to_sync_;  // fsync'ed after the rename, innermost first
  int fd_ = -1;
  bool direct_ = false;
  AlignedBuffer staging_;
  uint64_t used_ = 0;     // bytes in staging_
  uint64_t flushed_ = 0;  // bytes written to the file (aligned while direct_)
  uint64_t size_ = 0;     // bytes appended
};

// ---------------------------------------------------------------------------------------------
// Reader

class PosixReadable final : public ReadableObject {
 public:
  PosixReadable(std::shared_ptr<Shared> sh, std::string key, std::string path, int fd,
                uint64_t size, bool direct)
      : sh_(std::move(sh)),
        key_(std::move(key)),
        path_(std::move(path)),
        name_(key_ + " (" + path_ + ")"),
        fd_(fd),
        size_(size),
        direct_(direct) {}

  ~PosixReadable() override { ::close(fd_); }

  uint64_t Size() const override { return size_; }
  uint64_t BytesRead() const override { return bytes_read_.load(std::memory_order_relaxed); }
  ReadPathBytes PathBytes() const override {
    ReadPathBytes b;
    b.direct = direct_bytes_.load(std::memory_order_relaxed);
    b.uring = uring_bytes_.load(std::memory_order_relaxed);
    b.page_cache = page_cache_bytes_.load(std::memory_order_relaxed);
    return b;
  }

  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    TQKV_RETURN_IF_ERROR(CheckRange(offset, dst.size()));
    if (dst.empty()) return Status::Ok();
#ifdef TQKV_HAVE_IO_URING
    if (dst.size() > sh_->opts.chunk_bytes && sh_->WantUring() && direct_) {
      const ReadRequest req{offset, dst};
      return ReadBatchUring(std::span<const ReadRequest>(&req, 1));
    }
#endif
    if (dst.size() > sh_->opts.chunk_bytes && direct_) {
      const ReadRequest req{offset, dst};
      return ReadDirectBatch(std::span<const ReadRequest>(&req, 1));
    }
    return ReadSync(offset, dst);
  }

  Status ReadBatch(std::span<const ReadRequest> reqs) override {
    for (const ReadRequest& r : reqs) TQKV_RETURN_IF_ERROR(CheckRange(r.offset, r.dst.size()));
#ifdef TQKV_HAVE_IO_URING
    if (sh_->WantUring() && direct_) return ReadBatchUring(reqs);
#endif
    if (direct_) return ReadDirectBatch(reqs);
    for (const ReadRequest& r : reqs) TQKV_RETURN_IF_ERROR(ReadSync(r.offset, r.dst));
    return Status::Ok();
  }

  Status DropCache() override {
    if (::fdatasync(fd_) != 0 && errno != EINVAL && errno != EROFS && errno != EBADF) {
      return Status::FromErrno("fdatasync", name_, errno);
    }
    const int err = ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    if (err != 0) return Status::FromErrno("posix_fadvise(DONTNEED)", name_, err);
    return Status::Ok();
  }

 private:
  Status CheckRange(uint64_t offset, uint64_t len) const {
    if (offset > size_ || len > size_ - offset) {
      return Status::Corruption("read of " + std::to_string(len) + " bytes at offset " +
                                std::to_string(offset) + " is past the end of " + name_ +
                                " (size " + std::to_string(size_) + ")");
    }
    return Status::Ok();
  }

  Status Eof(uint64_t off) const {
    return Status::Corruption("unexpected end of file reading " + AtOffset(name_, off) +
                              " (the file is shorter than the " + std::to_string(size_) +
                              " bytes it had when opened)");
  }

  // pread until `len` bytes or end of file; returns the bytes read.
  Result<uint64_t> RawRead(uint8_t* buf, uint64_t len, uint64_t off) {
    uint64_t got = 0;
    while (got < len) {
      const uint64_t want = std::min(len - got, kMaxSyscallBytes);
      const bool was_direct = direct_.load();
      ssize_t r = SimulatedReadError(off + got, want)
                      ? (errno = EIO, -1)
                      : ::pread(fd_, buf + got, want, static_cast<off_t>(off + got));
      if (sh_->opts.simulate_short_io && r > 1) r /= 2;
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && direct_.load()) {
          direct_ = false;
          if (sh_->DisableDirect(fd_)) continue;
        }
        // Another thread turned O_DIRECT off but has not cleared the flag yet: clear it here.
        if (errno == EINVAL && FdIsDirect() && ClearDirectFlag(fd_)) continue;
        return Status::FromErrno("read", AtOffset(name_, off + got), errno);
      }
      if (r == 0) break;
      bytes_read_.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
      (was_direct ? direct_bytes_ : page_cache_bytes_)
          .fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
      got += static_cast<uint64_t>(r);
      if (direct_.load() && got < len && !IsAligned(got)) {
        // The file's unaligned end (a tail read): O_DIRECT stays on for the reads after it.
        if (off + got >= size_) break;
        // Short O_DIRECT read inside the file: continue through the page cache.
        direct_ = false;
        (void)ClearDirectFlag(fd_);
      }
    }
    return got;
  }

  bool SimulatedReadError(uint64_t off, uint64_t len) const {
    const uint64_t at = sh_->opts.simulate_read_error_at;
    return at >= off && at - off < len;
  }
  bool FdIsDirect() const {
    const int fl = ::fcntl(fd_, F_GETFL);
    return fl >= 0 && (fl & O_DIRECT) != 0;
  }

  // O_DIRECT batches: pieces of at most `chunk` bytes, read by the store's I/O threads
  // (qd > 1) or one after another here.
  Status ReadDirectBatch(std::span<const ReadRequest> reqs) {
    ThreadPool* pool = sh_->ReadPool();
    const std::vector<ReadRequest> pieces =
        posix_internal::SplitReads(reqs, sh_->opts.chunk_bytes, kAlign);
    if (pool == nullptr || pieces.size() <= 1) {
      for (const ReadRequest& p : pieces) TQKV_RETURN_IF_ERROR(ReadSync(p.offset, p.dst));
      return Status::Ok();
    }
    return posix_internal::ReadPieces(
        *pool, pieces, [this](const ReadRequest& p) { return ReadSync(p.offset, p.dst); });
  }

  // A bounce buffer of at least `bytes` (aligned): a pooled one, or one of just that size, so the
  // header and index reads of a small object do not fault in a chunk-sized (huge-page) buffer.
  AlignedBuffer TakeBounce(uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      for (size_t i = pool_.size(); i-- > 0;) {
        if (pool_[i].size() < bytes) continue;
        AlignedBuffer b = std::move(pool_[i]);
        pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    }
    return AlignedBuffer(static_cast<size_t>(AlignUp(bytes, kAlign)), kAlign);
  }

  void ReturnBounce(AlignedBuffer b) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (pool_.size() < kMaxPooledBounce) pool_.push_back(std::move(b));
  }

  Status ReadSync(uint64_t off, std::span<uint8_t> dst) {
    while (!dst.empty()) {
      if (!direct_.load()) {
        TQKV_ASSIGN_OR_RETURN(uint64_t got, RawRead(dst.data(), dst.size(), off));
        if (got < dst.size()) return Eof(off + got);
        return Status::Ok();
      }
      uint64_t n = 0;
      if (IsAligned(off) && IsAlignedPtr(dst.data()) && dst.size() >= kAlign) {
        // Straight into the caller's buffer.
        n = AlignDown(std::min<uint64_t>(dst.size(), kMaxSyscallBytes), kAlign);
        TQKV_ASSIGN_OR_RETURN(uint64_t got, RawRead(dst.data(), n, off));
        if (got < n) return Eof(off + got);
      } else {
        // Through an aligned bounce buffer: the covering blocks, then copy out.
        const uint64_t io_off = AlignDown(off, kAlign);
        const uint64_t skip = off - io_off;
        n = std::min<uint64_t>(dst.size(), sh_->opts.chunk_bytes);
        // When buffer and offset share their misalignment, stop at the next block boundary:
        // the rest can then go straight into dst.
        const uint64_t to_boundary = AlignUp(off, kAlign) - off;
        if ((reinterpret_cast<uintptr_t>(dst.data()) + to_boundary) % kAlign == 0 &&
            to_boundary > 0 && to_boundary < n && dst.size() - to_boundary >= kAlign) {
          n = to_boundary;
        }
        const uint64_t io_len = AlignUp(skip + n, kAlign);  // may pass EOF: short read is fine
        AlignedBuffer bounce = TakeBounce(io_len);
        auto got = RawRead(bounce.data(), io_len, io_off);
        if (!got.ok()) return got.status();
        if (*got < skip + n) return Eof(io_off + *got);
        std::memcpy(dst.data(), bounce.data() + skip, n);
        ReturnBounce(std::move(bounce));
      }
      off += n;
      dst = dst.subspan(n);
    }
    return Status::Ok();
  }

#ifdef TQKV_HAVE_IO_URING
  Status ReadBatchUring(std::span<const ReadRequest> reqs) {
    using posix_internal::UringPiece;
    const uint64_t chunk = sh_->opts.chunk_bytes;
    std::vector<UringPiece> pieces;
    for (const ReadRequest& r : reqs) {
      uint64_t off = r.offset;
      std::span<uint8_t> dst = r.dst;
      while (!dst.empty()) {
        UringPiece p;
        p.off = off;
        p.dst = dst.data();
        if (IsAligned(off) && IsAlignedPtr(dst.data()) && dst.size() >= kAlign) {
          p.len = static_cast<uint32_t>(std::min<uint64_t>(AlignDown(dst.size(), kAlign), chunk));
        } else {
          p.bounce = true;
          p.io_off = AlignDown(off, kAlign);
          uint64_t n = std::min<uint64_t>(dst.size(), chunk);
          const uint64_t to_boundary = AlignUp(off, kAlign) - off;
          if ((reinterpret_cast<uintptr_t>(dst.data()) + to_boundary) % kAlign == 0 &&
              to_boundary > 0 && to_boundary < n && dst.size() - to_boundary >= kAlign) {
            n = to_boundary;
          }
          p.len = static_cast<uint32_t>(n);
          p.io_len = static_cast<uint32_t>(AlignUp(off - p.io_off + n, kAlign));
        }
        pieces.push_back(p);
        off += p.len;
        dst = dst.subspan(p.len);
      }
    }
    std::vector<size_t> retry;
    // One ring per concurrent batch (the restore reads several at once): an idle one, or a new one.
    std::unique_ptr<posix_internal::UringReader> ring;
    {
      std::lock_guard<std::mutex> lock(ring_mu_);
      if (!rings_.empty()) {
        ring = std::move(rings_.back());
        rings_.pop_back();
      }
    }
    if (ring == nullptr) {
      auto made = posix_internal::UringReader::Create(sh_->opts.queue_depth, chunk + 2 * kAlign);
      if (!made.ok()) {
        sh_->uring_refused = true;  // e.g. out of locked memory: O_DIRECT preads instead
        return ReadDirectBatch(reqs);
      }
      ring = std::move(made).value();
    }
    uint64_t moved = 0;
    const Status status = ring->Run(fd_, pieces, name_, &retry, &moved);
    bytes_read_.fetch_add(moved, std::memory_order_relaxed);
    direct_bytes_.fetch_add(moved, std::memory_order_relaxed);
    uring_bytes_.fetch_add(moved, std::memory_order_relaxed);
    if (status.ok()) {  // after an error the ring may hold requests: it is dropped
      std::lock_guard<std::mutex> lock(ring_mu_);
      if (rings_.size() < kMaxPooledRings) rings_.push_back(std::move(ring));
    }
    TQKV_RETURN_IF_ERROR(status);
    for (size_t i : retry) {
      const UringPiece& p = pieces[i];
      TQKV_RETURN_IF_ERROR(ReadSync(p.off, std::span<uint8_t>(p.dst, p.len)));
    }
    return Status::Ok();
  }

  static constexpr size_t kMaxPooledRings = 8;
  std::mutex ring_mu_;
  std::vector<std::unique_ptr<posix_internal::UringReader>> rings_;  // idle rings
#endif

  std::shared_ptr<Shared> sh_;
  std::string key_;
  std::string path_;
  std::string name_;
  int fd_;
  uint64_t size_;
  std::atomic<bool> direct_;
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> direct_bytes_{0}, uring_bytes_{0}, page_cache_bytes_{0};
  std::mutex pool_mu_;
  std::vector<AlignedBuffer> pool_;
};

// ---------------------------------------------------------------------------------------------
// Store

// The store is its own SessionAdmin (tqkv/store_admin.h), as the nfs and redis stores are.
class PosixStore final : public Store, public SessionAdmin {
 public:
  explicit PosixStore(std::shared_ptr<Shared> sh)
      : sh_(std::move(sh)), admin_(MakePosixSessionAdmin(sh_->opts.dir)) {}

  std::optional<std::string> LocalRoot() const override { return sh_->opts.dir; }
  std::optional<std::string> LocalPath(std::string_view key) const override {
    if (!sh_->CheckKey(key).ok()) return std::nullopt;
    return sh_->ObjectPath(key);
  }

  Result<std::vector<SessionMeta>> ListSessions() override { return admin_->ListSessions(); }
  Status SetPin(std::string_view key, int64_t until_ns) override {
    return admin_->SetPin(key, until_ns);
  }
  Status RemoveIfUnchanged(const SessionMeta& listed) override {
    return admin_->RemoveIfUnchanged(listed);
  }

  std::string_view Name() const override { return "posix"; }

  std::string Uri() const override {
    const PosixStoreOptions& o = sh_->opts;
    std::string uri = "file://";
    for (char c : o.dir) {
      if (c == '%' || c == '?' || c == '#' || c == '&' || c == ' ') {
        static const char kHex[] = "0123456789ABCDEF";
        uri += '%';
        uri += kHex[(static_cast<unsigned char>(c) >> 4) & 0xf];
        uri += kHex[static_cast<unsigned char>(c) & 0xf];
      } else {
        uri += c;
      }
    }
    uri += "?io=" + std::string(IoModeName(o.io));
    if (o.io != IoMode::kBuffered) uri += "&qd=" + std::to_string(o.queue_depth);
    if (o.io == IoMode::kDirect && o.direct_threads) uri += "&engine=threads";
    uri += "&chunk=" + std::to_string(o.chunk_bytes);
    return uri;
  }

  StoreCaps Caps() const override {
    StoreCaps caps;
    caps.io_alignment = kAlign;
    caps.atomic_publish = true;
    caps.drop_cache = true;
    caps.io_mode = sh_->EffectiveMode();
    caps.io_fell_back = caps.io_mode != sh_->opts.io;
    return caps;
  }

  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(sh_->CheckKey(key));
    const std::string final_path = sh_->ObjectPath(key);
    const std::string parent = ParentDir(final_path);
    std::vector<std::string> dirs_to_sync{parent};
    // Directories for '/' segments; each one created here must reach disk too.
    for (size_t pos = key.find('/'); pos != std::string_view::npos; pos = key.find('/', pos + 1)) {
      const std::string dir = sh_->opts.dir + "/" + std::string(key.substr(0, pos));
      if (::mkdir(dir.c_str(), 0755) == 0) {
        dirs_to_sync.push_back(ParentDir(dir));
      } else if (errno != EEXIST) {
        return Status::FromErrno("mkdir", dir + " for object " + std::string(key), errno);
      }
    }
    std::reverse(dirs_to_sync.begin() + 1, dirs_to_sync.end());  // innermost first after parent
    const std::string tmp_path = store_internal::TempPath(final_path, "");
    bool direct = false;
    const int fd =
        OpenMaybeDirect(sh_.get(), tmp_path, O_WRONLY | O_CREAT | O_EXCL, 0644, &direct);
    if (fd < 0) {
      return Status::FromErrno("create", tmp_path + " for object " + std::string(key), errno);
    }
    return std::unique_ptr<WritableObject>(
        std::make_unique<PosixWritable>(sh_, std::string(key), final_path, tmp_path,
                                        std::move(dirs_to_sync), fd, direct));
  }

  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(sh_->CheckKey(key));
    const std::string path = sh_->ObjectPath(key);
    bool direct = false;
    // O_NONBLOCK: a FIFO (or device) under the object's name must not block the open; it is
    // refused below, and the flag is cleared for a regular file.
    const int fd = OpenMaybeDirect(sh_.get(), path, O_RDONLY | O_NONBLOCK, 0, &direct);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR) {
        return Status::NotFound("no object " + std::string(key) + " (" + path + ")");
      }
      return Status::FromErrno("open", path, errno);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return Status::FromErrno("fstat", path, err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status::NotFound("no object " + std::string(key) + " (" + path +
                              " is not a regular file)");
    }
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
      const int err = errno;
      ::close(fd);
      return Status::FromErrno("fcntl", path, err);
    }
    // Last use for gc's LRU, set explicitly: with relatime or noatime the kernel's atime is
    // coarse or frozen. Best effort (a read-only store keeps the kernel's atime).
    const timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    (void)::futimens(fd, times);
    return std::unique_ptr<ReadableObject>(std::make_unique<PosixReadable>(
        sh_, std::string(key), path, fd, static_cast<uint64_t>(st.st_size), direct));
  }

  Status Remove(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(sh_->CheckKey(key));
    const std::string path = sh_->ObjectPath(key);
    if (::unlink(path.c_str()) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) {
        return Status::NotFound("no object " + std::string(key) + " (" + path + ")");
      }
      return Status::FromErrno("unlink", path, errno);
    }
    return SyncDir(ParentDir(path));
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    // Start in the deepest directory the prefix names completely.
    const size_t slash = prefix.rfind('/');
    std::string rel;
    if (slash != std::string_view::npos) {
      rel = std::string(prefix.substr(0, slash + 1));
      // A prefix whose directory part no valid key can have matches nothing.
      if (!ValidateKey(rel + "x").ok()) return out;
    }
    TQKV_RETURN_IF_ERROR(Walk(rel, prefix, &out, nullptr));
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  Result<uint64_t> RemoveStaleTemps(std::chrono::seconds min_age) override {
    return SweepStaleTemps(min_age, /*remove=*/true);
  }
  Result<uint64_t> CountStaleTemps(std::chrono::seconds min_age) override {
    return SweepStaleTemps(min_age, /*remove=*/false);
  }

 private:
  struct StaleSweep {
    int64_t cutoff_ns = 0;
    bool remove = true;  // false: count only (gc --dry-run)
    uint64_t removed = 0;
  };

  Result<uint64_t> SweepStaleTemps(std::chrono::seconds min_age, bool remove) {
    StaleSweep sweep;
    sweep.cutoff_ns = store_internal::NowUnixNs() -
                      std::chrono::duration_cast<std::chrono::nanoseconds>(min_age).count();
    sweep.remove = remove;
    TQKV_RETURN_IF_ERROR(Walk("", "", nullptr, &sweep));
    return sweep.removed;
  }

  // Visits <dir>/<rel>: committed objects matching `prefix` go to `objects`; temp files older
  // than the cutoff are deleted (or counted) when `sweep` is set. rel is "" or ends in '/'.
  Status Walk(const std::string& rel, std::string_view prefix, std::vector<ObjectInfo>* objects,
              StaleSweep* sweep) {
    const std::string dir_path = rel.empty() ? sh_->opts.dir : sh_->opts.dir + "/" + rel;
    DIR* d = ::opendir(dir_path.c_str());
    if (d == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return Status::Ok();
      return Status::FromErrno("opendir", dir_path, errno);
    }
    const int dfd = ::dirfd(d);
    Status status;
    std::vector<std::string> subdirs;
    while (true) {
      errno = 0;
      const dirent* e = ::readdir(d);
      if (e == nullptr) {
        if (errno != 0) status = Status::FromErrno("readdir", dir_path, errno);
        break;
      }
      const std::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st {};
      unsigned char type = e->d_type;
      const store_internal::FileKind kind = store_internal::ClassifyFileName(name);
      const bool is_object = kind == store_internal::FileKind::kObject;
      const bool is_temp =
          kind == store_internal::FileKind::kTemp || kind == store_internal::FileKind::kProbe;
      if (type == DT_UNKNOWN || (objects && is_object) || (sweep && is_temp)) {
        if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // raced away
        type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
      }
      if (type == DT_DIR) {
        const std::string sub = rel + std::string(name) + "/";
        if (StartsWith(sub, prefix) || StartsWith(prefix, sub)) subdirs.push_back(sub);
        continue;
      }
      if (type != DT_REG) continue;
      if (objects != nullptr && is_object) {
        std::optional<std::string> key = store_internal::KeyOfObjectFile(rel, name);
        if (!key || !StartsWith(*key, prefix)) continue;
        ObjectInfo info;
        info.key = std::move(*key);
        info.size = static_cast<uint64_t>(st.st_size);
        info.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
        objects->push_back(std::move(info));
      } else if (sweep != nullptr && is_temp) {
        const int64_t mtime =
            static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
        if (mtime <= sweep->cutoff_ns) {
          if (!sweep->remove || ::unlinkat(dfd, e->d_name, 0) == 0) {
            ++sweep->removed;
          } else if (errno != ENOENT && status.ok()) {
            status = Status::FromErrno("unlink", dir_path + "/" + std::string(name), errno);
          }
        }
      }
    }
    ::closedir(d);
    TQKV_RETURN_IF_ERROR(status);
    for (const std::string& sub : subdirs) {
      TQKV_RETURN_IF_ERROR(Walk(sub, prefix, objects, sweep));
    }
    return Status::Ok();
  }

  std::shared_ptr<Shared> sh_;
  std::unique_ptr<SessionAdmin> admin_;
};

Status MakeDirs(const std::string& dir) {
  std::string path;
  size_t pos = 0;
  while (pos <= dir.size()) {
    size_t next = dir.find('/', pos);
    if (next == std::string::npos) next = dir.size();
    path = dir.substr(0, next);
    pos = next + 1;
    if (path.empty()) continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::FromErrno("mkdir", path, errno);
    }
  }
  return Status::Ok();
}

// Can this directory's filesystem do O_DIRECT? Writes and reads one aligned block of a probe file.
// Only a definite EINVAL counts as "no"; anything else (read-only mount, permissions) leaves the
// decision to the first real open, which falls back the same way.
bool ProbeDirect(const std::string& dir) {
  const std::string probe = store_internal::ProbePath(dir);
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return errno != EINVAL;
  bool ok = true;
  AlignedBuffer block(kAlign, kAlign);
  std::memset(block.data(), 0, kAlign);
  if (::pwrite(fd, block.data(), kAlign, 0) < 0 && errno == EINVAL) ok = false;
  if (ok && ::pread(fd, block.data(), kAlign, 0) < 0 && errno == EINVAL) ok = false;
  ::close(fd);
  ::unlink(probe.c_str());
  return ok;
}

}  // namespace

Result<std::unique_ptr<Store>> OpenPosixStore(const PosixStoreOptions& options) {
  PosixStoreOptions o = options;
  if (o.dir.empty()) return Status::InvalidArgument("posix store: empty directory");
  if (o.dir.find('\0') != std::string::npos) {
    return Status::InvalidArgument("posix store: NUL byte in directory");
  }
  if (o.queue_depth < 1 || o.queue_depth > 256) {
    return Status::InvalidArgument("posix store: qd=" + std::to_string(o.queue_depth) +
                                   " out of range [1, 256]");
  }
  if (o.chunk_bytes < kAlign || o.chunk_bytes > (64u << 20) || !IsAligned(o.chunk_bytes)) {
    return Status::InvalidArgument("posix store: chunk=" + std::to_string(o.chunk_bytes) +
                                   " must be a multiple of 4096 in [4 KiB, 64 MiB]");
  }
  if (o.write_buffer_bytes < kAlign || o.write_buffer_bytes > (256u << 20) ||
      !IsAligned(o.write_buffer_bytes)) {
    return Status::InvalidArgument("posix store: write buffer " +
                                   std::to_string(o.write_buffer_bytes) +
                                   " must be a multiple of 4096 in [4 KiB, 256 MiB]");
  }
  if (o.dir[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr) return Status::FromErrno("getcwd", o.dir, errno);
    o.dir = std::string(cwd) + "/" + o.dir;
  }
  while (o.dir.size() > 1 && o.dir.back() == '/') o.dir.pop_back();
  if (o.create_dir) TQKV_RETURN_IF_ERROR(MakeDirs(o.dir));
  struct stat st {};
  if (::stat(o.dir.c_str(), &st) != 0) return Status::FromErrno("stat", o.dir, errno);
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("posix store: " + o.dir + " is not a directory");
  }
  auto sh = std::make_shared<Shared>();
  sh->opts = o;
  if (o.io != IoMode::kBuffered) {
    if (o.simulate_no_direct || !ProbeDirect(o.dir)) sh->direct_refused = true;
  }
  if (o.io == IoMode::kUring || (o.io == IoMode::kDirect && !o.direct_threads)) {
#ifdef TQKV_HAVE_IO_URING
    if (!posix_internal::UringReader::Create(o.queue_depth, 0).ok()) sh->uring_refused = true;
#else
    sh->uring_refused = true;  // built without liburing
#endif
  }
  if (o.simulate_no_direct) {
    // Objects must see the refusal too: their opens go through WantDirect().
    sh->direct_refused = true;
  }
  return std::unique_ptr<Store>(std::make_unique<PosixStore>(std::move(sh)));
}

Result<std::unique_ptr<Store>> OpenPosixStoreFromUri(const StoreUri& uri) {
  PosixStoreOptions o;
  o.dir = uri.path;
  store_internal::UriOptions opts(uri);
  if (const std::string* io = opts.Find("io")) {
    TQKV_ASSIGN_OR_RETURN(o.io, ParseIoMode(*io));
  }
  uint64_t qd = o.queue_depth;
  TQKV_RETURN_IF_ERROR(opts.GetCount("qd", 1, 256, &qd));
  o.queue_depth = static_cast<uint32_t>(qd);
  TQKV_RETURN_IF_ERROR(opts.GetBytes("chunk", kAlign, 64u << 20, &o.chunk_bytes));
  TQKV_RETURN_IF_ERROR(opts.GetBool("create", &o.create_dir));
  if (const std::string* engine = opts.Find("engine")) {
    if (*engine != "threads" && *engine != "uring") {
      return Status::InvalidArgument("posix store: engine=" + *engine +
                                     " (io=direct reads with uring or threads)");
    }
    o.direct_threads = *engine == "threads";
  }
  TQKV_RETURN_IF_ERROR(opts.Finish());
  return OpenPosixStore(o);
}

}  // namespace tqkv
