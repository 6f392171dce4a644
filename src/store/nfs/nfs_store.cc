// NFSv3 store through libnfs: async pread/pwrite with several RPCs in flight, rename publish.
#include "store/nfs/nfs_store.h"

#include <fcntl.h>
#include <nfsc/libnfs.h>
#include <poll.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "store/file_layout.h"
#include "store/publishing_writer.h"
#include "tqkv/store_admin.h"
#include "store/store_internal.h"

namespace tqkv {
namespace {

constexpr int kNf3Dir = 2;  // NF3DIR

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

struct NfsConfig {
  std::string server;
  std::string export_path;  // what was mounted
  std::string root;         // directory of the store inside the export: "" or "/a/b"
  uint32_t depth = 8;
  uint64_t chunk = 1u << 20;
  uint32_t timeout_s = 30;  // each RPC (mount included): a stopped server is an error after it
  std::string uri;
};

// What a batch reports when a request got no reply within the timeout.
Status NoReply(const NfsConfig& cfg) {
  return Status::IoError("nfs: no reply from nfs://" + cfg.server + " for " +
                         std::to_string(cfg.timeout_s) + " s (the store URI's timeout)");
}

// One async batch's state, on the heap: a batch abandoned with requests in flight is kept by its
// Conn, since destroying the context later runs their callbacks (as cancelled).
struct AsyncBatch {
  struct Slot {
    AsyncBatch* batch;
    size_t index;
    bool done;
    Status result;
  };
  AsyncBatch(size_t n, const NfsConfig* config,
             const std::function<Status(size_t, int, void*)>* done_fn)
      : slots(n), cfg(config), on_done(done_fn) {}
  std::vector<Slot> slots;
  const NfsConfig* cfg;  // its Conn's, which keeps an abandoned batch
  const std::function<Status(size_t, int, void*)>* on_done;  // the caller's: dead once abandoned
  size_t in_flight = 0;
  bool abandoned = false;
};

// One mounted context; libnfs contexts are not thread-safe, so every call holds mu.
struct Conn {
  std::mutex mu;
  nfs_context* ctx = nullptr;
  NfsConfig cfg;
  // Set when an async batch had to be abandoned with requests in flight: the context is never
  // serviced again; the batches stay here until it is destroyed.
  bool broken = false;
  std::vector<std::unique_ptr<AsyncBatch>> abandoned;
  Status Usable() const {
    return broken ? Status::IoError("nfs: connection to " + cfg.server + " failed earlier; reopen the store")
                  : Status::Ok();
  }
  ~Conn() {
    if (ctx != nullptr) nfs_destroy_context(ctx);  // before `abandoned`: it runs their callbacks
  }
  std::string Error(std::string_view what, std::string_view path, int rc) const {
    return std::string(what) + " nfs://" + cfg.server + cfg.export_path + std::string(path) + ": " +
           std::strerror(-rc) + " (" + (ctx ? nfs_get_error(ctx) : "") + ")";
  }
  Status Err(std::string_view what, std::string_view path, int rc) const {
    const std::string msg = Error(what, path, rc);
    if (rc == -ENOENT) return Status::NotFound(msg);
    if (rc == -ENOSPC || rc == -EDQUOT) return Status::NoSpace(msg);
    return Status::IoError(msg);
  }
  Status Abandon(std::unique_ptr<AsyncBatch> batch, Status why) {
    batch->abandoned = true;
    abandoned.push_back(std::move(batch));
    broken = true;
    return why;
  }
};

// Runs n async operations with at most `depth` in flight; caller holds conn->mu. issue(i, cb,
// priv) queues operation i; its callback result goes to on_done(i, status, data). Every queued
// operation is waited for, even after an error. libnfs times out each request itself (the URI's
// timeout, set on the context): a server that stops answering fails the batch and leaves the
// context usable. The batch is abandoned (the context broken) only if that does not happen.
Status RunAsync(Conn* conn, size_t n, uint32_t depth,
                const std::function<int(size_t, nfs_cb, void*)>& issue,
                const std::function<Status(size_t, int, void*)>& on_done) {
  auto batch = std::make_unique<AsyncBatch>(n, &conn->cfg, &on_done);
  size_t next = 0, completed = 0;
  Status first;
  nfs_cb cb = [](int status, nfs_context*, void* data, void* priv) {
    auto* s = static_cast<AsyncBatch::Slot*>(priv);
    AsyncBatch* b = s->batch;
    if (b->abandoned) return;
    s->done = true;
    // libnfs reports its own timeout (and a cancel) as -EINTR.
    s->result = status == -EINTR ? NoReply(*b->cfg) : (*b->on_done)(s->index, status, data);
    --b->in_flight;
  };
  // libnfs times each request out at the URI's timeout from when it was queued; this bound (no
  // reply at all for longer) is only a backstop.
  const int backstop_polls = static_cast<int>(conn->cfg.timeout_s) + 4;
  int idle_polls = 0;
  while (completed < n) {
    while (first.ok() && next < n && batch->in_flight < depth) {
      AsyncBatch::Slot& s = batch->slots[next];
      s = AsyncBatch::Slot{batch.get(), next, false, Status::Ok()};
      const int rc = issue(next, cb, &s);
      if (rc < 0) {
        first = conn->Err("queue request on", "", rc);
        break;
      }
      ++batch->in_flight;
      ++next;
    }
    if (batch->in_flight == 0) break;
    pollfd pfd{nfs_get_fd(conn->ctx), static_cast<short>(nfs_which_events(conn->ctx)), 0};
    const int pr = ::poll(&pfd, 1, 1000);
    if (pr < 0 && errno != EINTR) {
      return conn->Abandon(std::move(batch), Status::FromErrno("poll", "nfs socket", errno));
    }
    if (pr == 0 && ++idle_polls >= backstop_polls) {
      return conn->Abandon(std::move(batch), NoReply(conn->cfg));
    }
    if (pr > 0) idle_polls = 0;
    if (nfs_service(conn->ctx, pr > 0 ? pfd.revents : 0) < 0) {
      return conn->Abandon(std::move(batch),
                           Status::IoError("nfs: connection to " + conn->cfg.server +
                                           " failed: " + nfs_get_error(conn->ctx)));
    }
    completed = 0;
    for (size_t i = 0; i < next; ++i) {
      const AsyncBatch::Slot& s = batch->slots[i];
      if (s.done) {
        ++completed;
        if (!s.result.ok() && first.ok()) first = s.result;
      }
    }
    if (!first.ok() && batch->in_flight == 0) break;
  }
  return first;
}

class NfsWritable final : public store_internal::PublishingWriter {
 public:
  NfsWritable(std::shared_ptr<Conn> conn, std::string key, std::string final_path,
              std::string tmp_path, nfsfh* fh)
      : PublishingWriter("nfs", std::move(key)),
        conn_(std::move(conn)),
        final_path_(std::move(final_path)),
        tmp_path_(std::move(tmp_path)),
        fh_(fh) {
    staging_.reserve(conn_->cfg.chunk * conn_->cfg.depth);
  }
  ~NfsWritable() override { DiscardIfUnfinished(); }

  uint64_t BytesWritten() const override { return written_; }

 private:
  Status AppendBytes(std::span<const uint8_t> src) override {
    const size_t cap = conn_->cfg.chunk * conn_->cfg.depth;
    while (!src.empty()) {
      const size_t n = std::min(cap - staging_.size(), src.size());
      staging_.insert(staging_.end(), src.begin(), src.begin() + n);
      src = src.subspan(n);
      written_ += n;
      if (staging_.size() == cap) TQKV_RETURN_IF_ERROR(Flush());
    }
    return Status::Ok();
  }

  Status Publish() override {
    TQKV_RETURN_IF_ERROR(Flush());
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    nfs_context* ctx = conn_->ctx;
    int rc = nfs_fsync(ctx, fh_);  // COMMIT: the server's stable storage
    if (rc < 0) return conn_->Err("commit (fsync)", tmp_path_, rc);
    rc = nfs_close(ctx, fh_);
    fh_ = nullptr;
    if (rc < 0) return conn_->Err("close", tmp_path_, rc);
    // mtime = publish time (List reports it; gc ages objects by it).
    timeval now[2];
    ::gettimeofday(&now[0], nullptr);
    now[1] = now[0];
    (void)nfs_utimes(ctx, tmp_path_.c_str(), now);
    // NFSv3 RENAME replaces the target atomically on the server and is stable when it returns.
    rc = nfs_rename(ctx, tmp_path_.c_str(), final_path_.c_str());
    if (rc < 0) return conn_->Err("rename " + tmp_path_ + " ->", final_path_, rc);
    return Status::Ok();
  }

  // The temp file stays, as after a real crash.
  void Stop() override {
    std::lock_guard<std::mutex> lock(conn_->mu);
    if (fh_ != nullptr && !conn_->broken) nfs_close(conn_->ctx, fh_);
    fh_ = nullptr;
  }

  Status Flush() {
    if (staging_.empty()) return Status::Ok();
    const uint64_t chunk = conn_->cfg.chunk;
    const size_t n = (staging_.size() + chunk - 1) / chunk;
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    const uint64_t base = flushed_;
    Status s = RunAsync(
        conn_.get(), n, conn_->cfg.depth,
        [&](size_t i, nfs_cb cb, void* priv) {
          const uint64_t off = i * chunk;
          const uint64_t len = std::min<uint64_t>(chunk, staging_.size() - off);
          return nfs_pwrite_async(conn_->ctx, fh_, base + off, len, staging_.data() + off, cb, priv);
        },
        [&](size_t i, int status, void* data) -> Status {
          const uint64_t off = i * chunk;
          const uint64_t len = std::min<uint64_t>(chunk, staging_.size() - off);
          if (status < 0) return conn_->Err("write", tmp_path_, status);
          if (static_cast<uint64_t>(status) != len) {
            // Short write: the rest goes synchronously.
            const uint64_t done = static_cast<uint64_t>(status);
            int rc = nfs_pwrite(conn_->ctx, fh_, base + off + done, len - done,
                                staging_.data() + off + done);
            if (rc < 0) return conn_->Err("write", tmp_path_, rc);
            if (static_cast<uint64_t>(rc) != len - done) {
              return Status::IoError("nfs: short write to " + tmp_path_);
            }
          }
          return Status::Ok();
        });
    if (!s.ok()) return s;
    flushed_ += staging_.size();
    staging_.clear();
    return Status::Ok();
  }

  Status Discard() override {
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    if (fh_ != nullptr) nfs_close(conn_->ctx, fh_);
    fh_ = nullptr;
    const int rc = nfs_unlink(conn_->ctx, tmp_path_.c_str());
    if (rc < 0 && rc != -ENOENT) return conn_->Err("unlink", tmp_path_, rc);
    return Status::Ok();
  }

  std::shared_ptr<Conn> conn_;
  std::string final_path_, tmp_path_;
  nfsfh* fh_;
  std::vector<uint8_t> staging_;
  uint64_t written_ = 0, flushed_ = 0;
};

class NfsReadable final : public ReadableObject {
 public:
  NfsReadable(std::shared_ptr<Conn> conn, std::string key, std::string pin_path, nfsfh* fh,
              uint64_t size)
      : conn_(std::move(conn)), key_(std::move(key)), pin_path_(std::move(pin_path)), fh_(fh),
        size_(size) {}
  ~NfsReadable() override {
    std::lock_guard<std::mutex> lock(conn_->mu);
    if (conn_->broken) return;
    nfs_close(conn_->ctx, fh_);
    nfs_unlink(conn_->ctx, pin_path_.c_str());
  }

  uint64_t Size() const override { return size_; }

  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    ReadRequest r{offset, dst};
    return ReadBatch(std::span<const ReadRequest>(&r, 1));
  }

  Status ReadBatch(std::span<const ReadRequest> reqs) override {
    struct Piece {
      uint64_t off, len;
      uint8_t* dst;
    };
    std::vector<Piece> pieces;
    const uint64_t chunk = conn_->cfg.chunk;
    for (const ReadRequest& r : reqs) {
      if (r.offset > size_ || r.dst.size() > size_ - r.offset) {
        return Status::Corruption("nfs object " + key_ + ": read of " +
                                  std::to_string(r.dst.size()) + " bytes at offset " +
                                  std::to_string(r.offset) + " is past its end (" +
                                  std::to_string(size_) + " bytes)");
      }
      for (uint64_t done = 0; done < r.dst.size();) {
        const uint64_t n = std::min<uint64_t>(chunk, r.dst.size() - done);
        pieces.push_back({r.offset + done, n, r.dst.data() + done});
        done += n;
      }
    }
    if (pieces.empty()) return Status::Ok();
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    Status s = RunAsync(
        conn_.get(), pieces.size(), conn_->cfg.depth,
        [&](size_t i, nfs_cb cb, void* priv) {
          return nfs_pread_async(conn_->ctx, fh_, pieces[i].off, pieces[i].len, cb, priv);
        },
        [&](size_t i, int status, void* data) -> Status {
          const Piece& p = pieces[i];
          if (status < 0) return conn_->Err("read", pin_path_, status);
          const uint64_t got = static_cast<uint64_t>(status);
          std::memcpy(p.dst, data, std::min(got, p.len));
          uint64_t done = std::min(got, p.len);
          while (done < p.len) {  // short read: finish synchronously
            int rc = nfs_pread(conn_->ctx, fh_, p.off + done, p.len - done, p.dst + done);
            if (rc < 0) return conn_->Err("read", pin_path_, rc);
            if (rc == 0) {
              return Status::Corruption("nfs object " + key_ + " ends early at " +
                                        std::to_string(p.off + done));
            }
            done += static_cast<uint64_t>(rc);
          }
          bytes_read_ += p.len;
          return Status::Ok();
        });
    return s;
  }

  uint64_t BytesRead() const override { return bytes_read_; }

 private:
  std::shared_ptr<Conn> conn_;
  std::string key_, pin_path_;
  nfsfh* fh_;
  uint64_t size_;
  std::atomic<uint64_t> bytes_read_{0};
};

class NfsStore final : public Store, public SessionAdmin {
 public:
  NfsStore(std::shared_ptr<Conn> conn, bool create_dir) : conn_(std::move(conn)) {}

  std::string_view Name() const override { return "nfs"; }
  std::string Uri() const override { return conn_->cfg.uri; }
  StoreCaps Caps() const override { return StoreCaps{}; }

  std::string FinalPath(std::string_view key) const {
    return store_internal::ObjectPath(conn_->cfg.root, key);
  }
  static std::string TempPath(const std::string& final_path, std::string_view tag) {
    return store_internal::TempPath(final_path, tag);
  }

  // mkdir -p of the directories above `path` (caller holds mu).
  Status MakeParents(const std::string& path) {
    for (size_t pos = conn_->cfg.root.size() + 1; (pos = path.find('/', pos)) != std::string::npos;
         ++pos) {
      const std::string dir = path.substr(0, pos);
      const int rc = nfs_mkdir(conn_->ctx, dir.c_str());
      if (rc < 0 && rc != -EEXIST) return conn_->Err("mkdir", dir, rc);
    }
    return Status::Ok();
  }

  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const std::string final_path = FinalPath(key);
    const std::string tmp = TempPath(final_path, "");
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    TQKV_RETURN_IF_ERROR(MakeParents(final_path));
    nfsfh* fh = nullptr;
    const int rc = nfs_create(conn_->ctx, tmp.c_str(), O_WRONLY | O_EXCL, 0644, &fh);
    if (rc < 0) return conn_->Err("create", tmp, rc);
    return std::unique_ptr<WritableObject>(
        std::make_unique<NfsWritable>(conn_, std::string(key), final_path, tmp, fh));
  }

  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const std::string final_path = FinalPath(key);
    const std::string pin = TempPath(final_path, "r");
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    // LINK names the file by the handle libnfs just looked up; a concurrent publish (rename over
    // it) can make that handle stale in between: look it up again.
    int rc = -ESTALE;
    // A lookup racing a rename on the server can also miss the name for a moment (ENOENT).
    // nfs-ganesha may also never answer a request on the handle of a file just replaced (it drops
    // it for the client to send again, which libnfs does not): a LINK that timed out (-EINTR) is
    // tried once more, and EEXIST then means the first one landed (the pin's name is ours alone).
    int timeouts = 0;
    for (int attempt = 0; attempt < 50; ++attempt) {
      rc = nfs_link(conn_->ctx, final_path.c_str(), pin.c_str());
      if (rc == -EINTR) ++timeouts;
      if (rc == -EEXIST && timeouts > 0) rc = 0;
      const bool again = rc == -ESTALE || (rc == -ENOENT && attempt < 3) ||
                         (rc == -EINTR && timeouts < 2);
      if (!again) break;
    }
    if (rc == -ENOENT || rc == -ENOTDIR) {
      return Status::NotFound("nfs: no object " + std::string(key) + " in " + Uri());
    }
    if (rc < 0) return conn_->Err("link (pin for reading)", final_path, rc);
    nfsfh* fh = nullptr;
    rc = nfs_open(conn_->ctx, pin.c_str(), O_RDONLY, &fh);
    nfs_stat_64 st{};
    if (rc == 0) rc = nfs_fstat64(conn_->ctx, fh, &st);
    if (rc < 0) {
      if (fh != nullptr) nfs_close(conn_->ctx, fh);
      nfs_unlink(conn_->ctx, pin.c_str());
      return conn_->Err("open", final_path, rc);
    }
    // Last access time for LRU eviction (tqkv gc); the publish time stays the mtime.
    timeval tv[2];
    ::gettimeofday(&tv[0], nullptr);
    tv[1].tv_sec = static_cast<time_t>(st.nfs_mtime);
    tv[1].tv_usec = static_cast<suseconds_t>(st.nfs_mtime_nsec / 1000);
    (void)nfs_utimes(conn_->ctx, pin.c_str(), tv);
    return std::unique_ptr<ReadableObject>(
        std::make_unique<NfsReadable>(conn_, std::string(key), pin, fh, st.nfs_size));
  }

  Status Remove(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const std::string p = FinalPath(key);
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    const int rc = nfs_unlink(conn_->ctx, p.c_str());
    if (rc == -ENOENT || rc == -ENOTDIR) {
      return Status::NotFound("nfs: no object " + std::string(key) + " in " + Uri());
    }
    if (rc < 0) return conn_->Err("unlink", p, rc);
    return Status::Ok();
  }

  std::string PinPath(std::string_view key) const {
    return store_internal::PinPath(FinalPath(key));
  }

  Result<std::vector<SessionMeta>> ListSessions() override {
    std::vector<SessionMeta> out;
    std::vector<std::string> pins;
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    TQKV_RETURN_IF_ERROR(Walk("", [&](const std::string& rel, const nfsdirent* e) {
      const std::string_view name(e->name);
      if (auto pinned = store_internal::KeyOfPinFile(rel, name)) {
        pins.push_back(std::move(*pinned));
        return;
      }
      std::optional<std::string> key = store_internal::KeyOfObjectFile(rel, name);
      if (!key) return;
      SessionMeta m;
      m.key = std::move(*key);
      m.size = e->size;
      m.mtime_ns = static_cast<int64_t>(e->mtime.tv_sec) * 1'000'000'000 + e->mtime_nsec;
      m.version = std::to_string(e->inode);  // a republish is a new file (renamed temp)
      m.atime_ns = static_cast<int64_t>(e->atime.tv_sec) * 1'000'000'000 + e->atime_nsec;
      out.push_back(std::move(m));
    }));
    std::sort(out.begin(), out.end(),
              [](const SessionMeta& a, const SessionMeta& b) { return a.key < b.key; });
    for (const std::string& key : pins) {
      auto it = std::lower_bound(out.begin(), out.end(), key,
                                 [](const SessionMeta& m, const std::string& k) { return m.key < k; });
      if (it == out.end() || it->key != key) continue;
      nfsfh* fh = nullptr;
      const std::string p = PinPath(key);
      if (nfs_open(conn_->ctx, p.c_str(), O_RDONLY, &fh) != 0) continue;
      char buf[32] = {0};
      const int n = nfs_pread(conn_->ctx, fh, 0, sizeof(buf) - 1, buf);
      nfs_close(conn_->ctx, fh);
      if (n > 0) it->pin_until_ns = std::atoll(buf);
    }
    return out;
  }

  Status SetPin(std::string_view key, int64_t until_ns) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const std::string pin = PinPath(key);
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    if (until_ns == 0) {
      const int rc = nfs_unlink(conn_->ctx, pin.c_str());
      if (rc < 0 && rc != -ENOENT) return conn_->Err("unlink", pin, rc);
      return Status::Ok();
    }
    nfs_stat_64 st{};
    if (nfs_stat64(conn_->ctx, FinalPath(key).c_str(), &st) != 0) {
      return Status::NotFound("nfs: no object " + std::string(key) + " in " + Uri());
    }
    const std::string tmp = TempPath(FinalPath(key), "p");
    nfsfh* fh = nullptr;
    int rc = nfs_create(conn_->ctx, tmp.c_str(), O_WRONLY | O_EXCL, 0644, &fh);
    if (rc < 0) return conn_->Err("create", tmp, rc);
    const std::string text = std::to_string(until_ns) + "\n";
    rc = nfs_pwrite(conn_->ctx, fh, 0, text.size(), text.data());
    nfs_close(conn_->ctx, fh);
    if (rc >= 0) rc = nfs_rename(conn_->ctx, tmp.c_str(), pin.c_str());
    if (rc < 0) {
      nfs_unlink(conn_->ctx, tmp.c_str());
      return conn_->Err("write pin", pin, rc);
    }
    return Status::Ok();
  }

  // Renamed aside first, then checked (as the POSIX store does): a version published after the
  // listing is put back, never deleted.
  Status RemoveIfUnchanged(const SessionMeta& listed) override {
    const std::string& key = listed.key;
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const std::string p = FinalPath(key);
    const std::string aside = TempPath(p, "gc");
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    int rc = nfs_rename(conn_->ctx, p.c_str(), aside.c_str());
    if (rc == -ENOENT) return Status::NotFound("nfs: no object " + key);
    if (rc < 0) return conn_->Err("rename", p, rc);
    nfs_stat_64 st{};
    if (nfs_stat64(conn_->ctx, aside.c_str(), &st) == 0 &&
        static_cast<int64_t>(st.nfs_mtime) * 1'000'000'000 +
                static_cast<int64_t>(st.nfs_mtime_nsec) == listed.mtime_ns &&
        (listed.version.empty() || listed.version == std::to_string(st.nfs_ino))) {
      rc = nfs_unlink(conn_->ctx, aside.c_str());
      if (rc < 0) return conn_->Err("unlink", aside, rc);
      nfs_unlink(conn_->ctx, PinPath(key).c_str());
      return Status::Ok();
    }
    const Status kept = Status::Busy("nfs: object " + key + " was published again; kept");
    rc = nfs_link(conn_->ctx, aside.c_str(), p.c_str());
    if (rc == 0 || rc == -EEXIST) {
      nfs_unlink(conn_->ctx, aside.c_str());  // back in place, or older than the one there now
      return kept;
    }
    rc = nfs_rename(conn_->ctx, aside.c_str(), p.c_str());  // no hard links on this export
    if (rc < 0) return conn_->Err("rename", aside, rc);
    return kept;
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    TQKV_RETURN_IF_ERROR(Walk("", [&](const std::string& rel, const nfsdirent* e) {
      std::optional<std::string> key = store_internal::KeyOfObjectFile(rel, e->name);
      if (!key || !StartsWith(*key, prefix)) return;
      out.push_back({std::move(*key), e->size,
                     static_cast<int64_t>(e->mtime.tv_sec) * 1'000'000'000 +
                         static_cast<int64_t>(e->mtime_nsec)});
    }));
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
  // remove false: count only (gc --dry-run).
  Result<uint64_t> SweepStaleTemps(std::chrono::seconds min_age, bool remove) {
    std::vector<std::string> stale;
    const int64_t limit = store_internal::NowUnixNs() / 1'000'000'000 - min_age.count();
    std::lock_guard<std::mutex> lock(conn_->mu);
    TQKV_RETURN_IF_ERROR(conn_->Usable());
    TQKV_RETURN_IF_ERROR(Walk("", [&](const std::string& rel, const nfsdirent* e) {
      if (store_internal::ClassifyFileName(e->name) == store_internal::FileKind::kTemp &&
          static_cast<int64_t>(e->mtime.tv_sec) <= limit) {
        stale.push_back(conn_->cfg.root + "/" + rel + e->name);
      }
    }));
    if (!remove) return static_cast<uint64_t>(stale.size());
    uint64_t removed = 0;
    for (const auto& p : stale) {
      const int rc = nfs_unlink(conn_->ctx, p.c_str());
      if (rc == 0) ++removed;
    }
    return removed;
  }

  // Visits every non-directory entry below root/rel (caller holds mu); rel ends in '/' or is "".
  Status Walk(const std::string& rel,
              const std::function<void(const std::string&, const nfsdirent*)>& visit,
              int depth = 0) {
    if (depth > 64) return Status::Ok();
    const std::string dir = conn_->cfg.root + "/" + rel;
    nfsdir* d = nullptr;
    const int rc = nfs_opendir(conn_->ctx, dir.empty() ? "/" : dir.c_str(), &d);
    if (rc == -ENOENT) return Status::Ok();
    if (rc < 0) return conn_->Err("opendir", dir, rc);
    std::vector<std::string> subdirs;
    while (const nfsdirent* e = nfs_readdir(conn_->ctx, d)) {
      const std::string_view name(e->name);
      if (name == "." || name == "..") continue;
      if (e->type == kNf3Dir) {
        subdirs.emplace_back(name);
      } else {
        visit(rel, e);
      }
    }
    nfs_closedir(conn_->ctx, d);
    for (const auto& s : subdirs) TQKV_RETURN_IF_ERROR(Walk(rel + s + "/", visit, depth + 1));
    return Status::Ok();
  }

  std::shared_ptr<Conn> conn_;
};

// Mounts `export_path` on a fresh context; nullptr and the error text on failure.
nfs_context* TryMount(const std::string& url, uint32_t timeout_s, std::string* error) {
  nfs_context* ctx = nfs_init_context();
  if (ctx == nullptr) {
    *error = "cannot create an NFS context";
    return nullptr;
  }
  nfs_url* u = nfs_parse_url_dir(ctx, url.c_str());
  if (u == nullptr) {
    *error = std::string("bad NFS URL: ") + nfs_get_error(ctx);
    nfs_destroy_context(ctx);
    return nullptr;
  }
  nfs_set_timeout(ctx, static_cast<int>(timeout_s * 1000));
  const int rc = nfs_mount(ctx, u->server, u->path);
  nfs_destroy_url(u);
  if (rc != 0) {
    *error = nfs_get_error(ctx);
    nfs_destroy_context(ctx);
    return nullptr;
  }
  return ctx;
}

}  // namespace

Result<std::unique_ptr<Store>> OpenNfsStoreFromUri(const StoreUri& uri) {
  if (uri.authority.empty()) return Status::InvalidArgument("nfs:// needs a server: nfs://host/export/dir");
  std::string path = uri.path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.empty() || path == "/") {
    return Status::InvalidArgument("nfs:// needs an export path: nfs://host/export/dir");
  }
  store_internal::UriOptions opts(uri);
  NfsConfig cfg;
  cfg.server = uri.authority;
  uint64_t version = 3;
  TQKV_RETURN_IF_ERROR(opts.GetCount("version", 3, 4, &version));
  if (version != 3) {
    return Status::Unsupported(
        "nfs:// version=4 is not supported: libnfs 4.0 NFSv4 writes fail against nfs-ganesha; "
        "use version=3");
  }
  std::string extra = "?version=3";
  for (const char* k : {"nfsport", "mountport", "uid", "gid"}) {
    uint64_t v = 0;
    if (opts.Find(k) != nullptr) {
      TQKV_RETURN_IF_ERROR(opts.GetCount(k, 0, 1u << 31, &v));
      extra += std::string("&") + k + "=" + std::to_string(v);
    }
  }
  uint64_t depth = cfg.depth;
  TQKV_RETURN_IF_ERROR(opts.GetCount("depth", 1, 64, &depth));
  cfg.depth = static_cast<uint32_t>(depth);
  TQKV_RETURN_IF_ERROR(opts.GetBytes("chunk", 4096, 1u << 20, &cfg.chunk));
  uint64_t timeout_s = cfg.timeout_s;
  TQKV_RETURN_IF_ERROR(opts.GetSeconds("timeout", 1, 3600, &timeout_s));
  cfg.timeout_s = static_cast<uint32_t>(timeout_s);
  bool create = true;
  TQKV_RETURN_IF_ERROR(opts.GetBool("create", &create));
  std::string export_opt;
  if (const std::string* e = opts.Find("export")) export_opt = *e;
  if (const std::string* io = opts.Find("io")) {
    TQKV_ASSIGN_OR_RETURN(IoMode mode, ParseIoMode(*io));
    if (mode != IoMode::kBuffered) {
      return Status::InvalidArgument("nfs:// store supports only io=buffered (libnfs RPCs), not io=" +
                                     *io);
    }
  }
  TQKV_RETURN_IF_ERROR(opts.Finish());

  // The export is the longest leading part of the path the server mounts (or export=).
  std::vector<std::string> candidates;
  if (!export_opt.empty()) {
    if (!StartsWith(path, export_opt)) {
      return Status::InvalidArgument("nfs:// export=" + export_opt + " is not a prefix of " + path);
    }
    candidates.push_back(export_opt);
  } else {
    for (std::string p = path; !p.empty(); p = p.substr(0, p.rfind('/'))) candidates.push_back(p);
  }
  std::string first_error;
  nfs_context* ctx = nullptr;
  for (const std::string& exp : candidates) {
    std::string error;
    ctx = TryMount("nfs://" + cfg.server + exp + extra, cfg.timeout_s, &error);
    if (ctx != nullptr) {
      cfg.export_path = exp;
      cfg.root = path.substr(exp.size());
      break;
    }
    if (first_error.empty()) first_error = error;
    // A server that does not answer will not answer for a shorter export either: one timeout
    // is the bound, not one per candidate.
    if (error.find("timed out") != std::string::npos) break;
  }
  if (ctx == nullptr) {
    return Status::IoError("nfs: cannot mount nfs://" + cfg.server + path + ": " + first_error);
  }
  auto conn = std::make_shared<Conn>();
  conn->ctx = ctx;
  cfg.uri = "nfs://" + cfg.server + path;
  conn->cfg = cfg;
  // The store's directory.
  if (!conn->cfg.root.empty()) {
    std::lock_guard<std::mutex> lock(conn->mu);
    for (size_t pos = 1;; ++pos) {
      pos = conn->cfg.root.find('/', pos);
      const std::string dir = conn->cfg.root.substr(0, pos);
      nfs_stat_64 st{};
      int rc = nfs_stat64(ctx, dir.c_str(), &st);
      if (rc == -ENOENT && create) rc = nfs_mkdir(ctx, dir.c_str());
      if (rc == -EEXIST) rc = 0;
      if (rc < 0) return conn->Err(create ? "mkdir" : "stat", dir, rc);
      if (pos == std::string::npos) break;
    }
  }
  return std::unique_ptr<Store>(std::make_unique<NfsStore>(std::move(conn), create));
}

}  // namespace tqkv
