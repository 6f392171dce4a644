// The s3:// store (s3_store.h): multipart writers, ranged-GET readers, session admin by listing.
#include "store/s3/s3_store.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/file_layout.h"
#include "store/publishing_writer.h"
#include "store/s3/s3_client.h"
#include "store/s3/s3_read_ahead.h"
#include "store/store_internal.h"
#include "tqkv/store_admin.h"

namespace tqkv {
namespace {

using s3::Client;
using s3::HttpRequest;
using s3::HttpResponse;
using s3::S3Config;

constexpr std::string_view kAccessSuffix = ".tqkv.access";

// Names in the bucket (s3_store.h).
struct Names {
  std::string root;  // "PREFIX/" or ""
  std::string Object(std::string_view key) const {
    return root + std::string(key) + std::string(store_internal::kObjectSuffix);
  }
  // ".<base><suffix>" beside the object of `key`.
  std::string Side(std::string_view key, std::string_view suffix) const {
    const size_t slash = key.rfind('/');
    const std::string dir = slash == std::string_view::npos ? "" : std::string(key.substr(0, slash + 1));
    const std::string base(slash == std::string_view::npos ? key : key.substr(slash + 1));
    return root + dir + "." + base + std::string(suffix);
  }
  std::string Pin(std::string_view key) const { return Side(key, store_internal::kPinSuffix); }
  std::string Access(std::string_view key) const { return Side(key, kAccessSuffix); }
};

std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

// Writes the access record `name` with the time now, in ns as text: gc's last use of an object.
// Best effort and bounded: read-only credentials, or a cluster that cannot write now, still work.
void PutAccessTime(Client& client, const std::string& name) {
  const std::string now = std::to_string(store_internal::NowUnixNs());
  HttpRequest req;
  req.method = "PUT";
  req.key = name;
  req.body = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(now.data()), now.size());
  req.deadline_ms = 3000;
  (void)client.Run(req);
}

class S3Writable final : public store_internal::PublishingWriter {
 public:
  S3Writable(std::shared_ptr<Client> client, std::string key, std::string object,
             std::string access)
      : PublishingWriter("s3", key),
        client_(std::move(client)),
        object_(std::move(object)),
        access_(std::move(access)) {
    buf_.reserve(client_->cfg().part_bytes);
  }
  ~S3Writable() override {
    DiscardIfUnfinished();
    (void)WaitAll();
  }
  uint64_t BytesWritten() const override { return written_; }

 private:
  Status AppendBytes(std::span<const uint8_t> src) override {
    const uint64_t part = client_->cfg().part_bytes;
    while (!src.empty()) {
      const size_t n = std::min<size_t>(part - buf_.size(), src.size());
      buf_.insert(buf_.end(), src.begin(), src.begin() + n);
      src = src.subspan(n);
      written_ += n;
      if (buf_.size() == part) TQKV_RETURN_IF_ERROR(SendPart());
    }
    return Status::Ok();
  }

  // Publishes, then records the publish time exactly (as a read's touch does): listings give
  // whole seconds on some servers, and gc's least-recently-used order needs the exact one.
  Status Publish() override {
    TQKV_RETURN_IF_ERROR(PublishObject());
    PutAccessTime(*client_, access_);
    return Status::Ok();
  }

  Status PublishObject() {
    if (upload_id_.empty()) {  // smaller than one part: one PUT
      HttpRequest req;
      req.method = "PUT";
      req.key = object_;
      req.body = buf_;
      TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
      return client_->Check(r, "PUT", object_);
    }
    if (!buf_.empty()) TQKV_RETURN_IF_ERROR(SendPart());
    TQKV_RETURN_IF_ERROR(WaitAll());
    std::string xml = "<CompleteMultipartUpload>";
    for (size_t i = 0; i < etags_.size(); ++i) {
      xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags_[i] +
             "</ETag></Part>";
    }
    xml += "</CompleteMultipartUpload>";
    HttpRequest req;
    req.method = "POST";
    req.key = object_;
    req.query = {{"uploadId", upload_id_}};
    req.body = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(xml.data()), xml.size());
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
    TQKV_RETURN_IF_ERROR(client_->Check(r, "CompleteMultipartUpload", object_));
    // S3 may answer 200 and put the error in the body.
    if (r.body.find("<Error>") != std::string::npos) {
      return Status::IoError("s3: CompleteMultipartUpload of " + object_ + " failed: " +
                             s3::XmlText(r.body, "Code").value_or("?") + " " +
                             s3::XmlText(r.body, "Message").value_or(""));
    }
    upload_id_.clear();  // published: nothing to abort
    return Status::Ok();
  }

  Status Discard() override {
    (void)WaitAll();
    if (upload_id_.empty()) return Status::Ok();
    HttpRequest req;
    req.method = "DELETE";
    req.key = object_;
    req.query = {{"uploadId", upload_id_}};
    // Best effort and short: the writer is failing already (often on a stalled server), and
    // an upload left behind is gc's (RemoveStaleTemps).
    req.deadline_ms = 3000;
    upload_id_.clear();
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
    if (r.code == 404) return Status::Ok();  // already gone
    return client_->Check(r, "AbortMultipartUpload", object_);
  }

  // A crash: the parts sent stay on the server as an unfinished upload (invisible; gc aborts it).
  void Stop() override {
    (void)WaitAll();
    upload_id_.clear();
    buf_.clear();
  }

  Status Initiate() {
    HttpRequest req;
    req.method = "POST";
    req.key = object_;
    req.query = {{"uploads", ""}};
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
    TQKV_RETURN_IF_ERROR(client_->Check(r, "CreateMultipartUpload", object_));
    auto id = s3::XmlText(r.body, "UploadId");
    if (!id || id->empty()) {
      return Status::IoError("s3: CreateMultipartUpload of " + object_ + " returned no UploadId");
    }
    upload_id_ = *id;
    return Status::Ok();
  }

  // Sends buf_ as the next part in the background; at most `depth` parts in flight.
  Status SendPart() {
    if (upload_id_.empty()) TQKV_RETURN_IF_ERROR(Initiate());
    while (inflight_.size() >= client_->cfg().upload_depth) TQKV_RETURN_IF_ERROR(WaitOne());
    if (parts_ >= 10000) {
      return Status::ResourceExhausted("s3: object " + object_ + " needs more than 10000 parts; "
                                       "raise part= in the store URI");
    }
    auto data = std::make_shared<std::vector<uint8_t>>(std::move(buf_));
    buf_ = {};
    buf_.reserve(client_->cfg().part_bytes);
    const int number = static_cast<int>(++parts_);
    inflight_.push_back(std::async(std::launch::async, [c = client_, obj = object_,
                                                        id = upload_id_, number, data]()
                                                           -> Result<std::string> {
      HttpRequest req;
      req.method = "PUT";
      req.key = obj;
      req.query = {{"partNumber", std::to_string(number)}, {"uploadId", id}};
      req.body = *data;
      TQKV_ASSIGN_OR_RETURN(HttpResponse r, c->Run(req));
      TQKV_RETURN_IF_ERROR(c->Check(r, "UploadPart " + std::to_string(number), obj));
      if (r.etag.empty()) return Status::IoError("s3: UploadPart of " + obj + " returned no ETag");
      return r.etag;
    }));
    return Status::Ok();
  }

  Status WaitOne() {
    auto r = inflight_.front().get();
    inflight_.pop_front();
    if (!r.ok()) return r.status();
    etags_.push_back(*r);
    return Status::Ok();
  }

  Status WaitAll() {
    Status first;
    while (!inflight_.empty()) {
      Status s = WaitOne();
      if (first.ok()) first = s;
    }
    return first;
  }

  std::shared_ptr<Client> client_;
  std::string object_;
  std::string access_;  // the access record: written with the exact time on publish
  std::vector<uint8_t> buf_;
  std::string upload_id_;
  std::deque<std::future<Result<std::string>>> inflight_;
  std::vector<std::string> etags_;  // of parts 1..n, in order
  uint64_t parts_ = 0;
  uint64_t written_ = 0;
};

class S3Readable final : public ReadableObject {
 public:
  S3Readable(std::shared_ptr<Client> client, std::string key, std::string object, uint64_t size,
             std::string etag, std::future<void> touch)
      : client_(std::move(client)),
        key_(std::move(key)),
        object_(std::move(object)),
        size_(size),
        etag_(std::move(etag)),
        touch_(std::move(touch)) {}

  uint64_t Size() const override { return size_; }
  uint64_t BytesRead() const override {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    return bytes_read_ + (ahead_ != nullptr ? ahead_->BytesFetched() : 0);
  }

  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    ReadRequest r{offset, dst};
    return ReadBatch(std::span<const ReadRequest>(&r, 1));
  }

  // Bulk reads (a batch of kBulkBytes or more, and every read after one) go through the block
  // read-ahead (s3_read_ahead.h): few large GETs at multiples of `get`. Small reads before that
  // (a container's header and index) are GETs of just their bytes, each request split into GETs
  // of at most `get` bytes run on up to `lanes` threads.
  Status ReadBatch(std::span<const ReadRequest> reqs) override {
    uint64_t total = 0;
    for (const ReadRequest& r : reqs) {
      if (r.offset > size_ || r.dst.size() > size_ - r.offset) {
        return Status::Corruption("s3 object " + key_ + ": read of " +
                                  std::to_string(r.dst.size()) + " bytes at offset " +
                                  std::to_string(r.offset) + " is past its end (" +
                                  std::to_string(size_) + " bytes)");
      }
      total += r.dst.size();
    }
    if (s3::ReadAhead* ahead = Ahead(total)) {
      for (const ReadRequest& r : reqs) TQKV_RETURN_IF_ERROR(ahead->Read(r.offset, r.dst));
      return Status::Ok();
    }
    struct Piece {
      uint64_t off;
      std::span<uint8_t> dst;
    };
    std::vector<Piece> pieces;
    const uint64_t step = client_->cfg().get_bytes;
    for (const ReadRequest& r : reqs) {
      for (uint64_t done = 0; done < r.dst.size(); done += step) {
        const uint64_t n = std::min<uint64_t>(step, r.dst.size() - done);
        pieces.push_back({r.offset + done, r.dst.subspan(done, n)});
      }
    }
    if (pieces.empty()) return Status::Ok();
    std::atomic<size_t> next{0};
    std::mutex mu;
    Status first;
    auto lane = [&] {
      for (size_t i = next++; i < pieces.size(); i = next++) {
        Status s = Get(pieces[i].off, pieces[i].dst, {});
        if (s.ok()) bytes_read_ += pieces[i].dst.size();
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first.ok()) first = s;
          next = pieces.size();  // stop the other lanes early
        }
      }
    };
    const size_t lanes = std::min<size_t>(client_->cfg().lanes, pieces.size());
    std::vector<std::thread> threads;
    for (size_t i = 1; i < lanes; ++i) threads.emplace_back(lane);
    lane();
    for (auto& t : threads) t.join();
    return first;
  }

 private:
  static constexpr uint64_t kBulkBytes = 1u << 20;

  // The read-ahead, started by the first bulk batch; nullptr before.
  s3::ReadAhead* Ahead(uint64_t batch_bytes) {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    if (ahead_ == nullptr && batch_bytes >= kBulkBytes) {
      const s3::S3Config& cfg = client_->cfg();
      ahead_ = std::make_unique<s3::ReadAhead>(
          size_, cfg.get_bytes, cfg.lanes,
          [this](uint64_t off, std::span<uint8_t> dst, const std::function<bool(uint64_t)>& on) {
            return Get(off, dst, on);
          });
    }
    return ahead_.get();
  }

  Status Get(uint64_t off, std::span<uint8_t> dst, const std::function<bool(uint64_t)>& on_data) {
    HttpRequest req;
    req.key = object_;
    req.range = std::make_pair(off, static_cast<uint64_t>(dst.size()));
    req.dst = dst;
    req.if_match = etag_;
    req.on_data = on_data;
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
    if (r.code == 412 || r.code == 404) {
      return Status::NotFound("s3 object " + key_ + " was replaced or removed since it was opened "
                              "(ETag " + etag_ + " gone); open it again");
    }
    TQKV_RETURN_IF_ERROR(client_->Check(r, "GET", object_));
    if (r.code != 206 && !(r.code == 200 && off == 0 && dst.size() == size_)) {
      return Status::IoError("s3: ranged GET of " + object_ + " answered HTTP " +
                             std::to_string(r.code) + ", not 206");
    }
    if (r.received != dst.size()) {
      return Status::IoError("s3: GET of " + object_ + " at " + std::to_string(off) + " returned " +
                             std::to_string(r.received) + " of " + std::to_string(dst.size()) +
                             " bytes");
    }
    return Status::Ok();
  }

  std::shared_ptr<Client> client_;
  std::string key_, object_;
  uint64_t size_;
  std::string etag_;
  std::future<void> touch_;  // the access-time write; its destructor waits (at most 3 s)
  std::atomic<uint64_t> bytes_read_{0};
  mutable std::mutex ahead_mu_;
  std::unique_ptr<s3::ReadAhead> ahead_;  // last: stopped before the members its fetches use
};

struct Listed {
  std::string name;  // relative to the store's root
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string etag;
};

class S3Store final : public Store, public SessionAdmin {
 public:
  explicit S3Store(std::shared_ptr<Client> client) : client_(std::move(client)) {
    names_.root = cfg().prefix.empty() ? "" : cfg().prefix + "/";
  }

  std::string_view Name() const override { return "s3"; }
  std::string Uri() const override { return cfg().uri; }
  StoreCaps Caps() const override { return StoreCaps{}; }

  // Fails early on a wrong endpoint, missing bucket or refused credentials.
  Status Connect() {
    HttpRequest req;
    req.method = "GET";
    req.query = {{"list-type", "2"}, {"max-keys", "1"}, {"prefix", names_.root}};
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
    if (r.code == 404) {
      return Status::NotFound("s3: no bucket " + cfg().bucket + " at " +
                              (cfg().endpoint.empty() ? "AWS" : cfg().endpoint));
    }
    return client_->Check(r, "list", names_.root);
  }

  Result<std::unique_ptr<WritableObject>> Create(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    return std::unique_ptr<WritableObject>(
        std::make_unique<S3Writable>(client_, std::string(key), names_.Object(key),
                                     names_.Access(key)));
  }

  Result<std::unique_ptr<ReadableObject>> Open(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    const std::string obj = names_.Object(key);
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, Head(obj));
    if (r.code == 404) return Status::NotFound("s3: no object " + std::string(key) + " in " + Uri());
    TQKV_RETURN_IF_ERROR(client_->Check(r, "HEAD", obj));
    if (r.etag.empty()) return Status::IoError("s3: HEAD of " + obj + " returned no ETag");
    // Last access for LRU gc across processes, written while the reads run.
    auto touch = std::async(std::launch::async, [c = client_, name = names_.Access(key)] {
      PutAccessTime(*c, name);
    });
    return std::unique_ptr<ReadableObject>(std::make_unique<S3Readable>(
        client_, std::string(key), obj, r.length, r.etag, std::move(touch)));
  }

  Status Remove(std::string_view key) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, Head(names_.Object(key)));
    if (r.code == 404) return Status::NotFound("s3: no object " + std::string(key) + " in " + Uri());
    TQKV_RETURN_IF_ERROR(client_->Check(r, "HEAD", names_.Object(key)));
    return DeleteAll(key);
  }

  // HEAD, compare the ETag, DELETE: a version published between the HEAD and the DELETE (a few
  // milliseconds) is removed too; S3 has no portable conditional DELETE.
  Status RemoveIfUnchanged(const SessionMeta& listed) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(listed.key));
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, Head(names_.Object(listed.key)));
    if (r.code == 404) return Status::NotFound("s3: no object " + listed.key + " in " + Uri());
    TQKV_RETURN_IF_ERROR(client_->Check(r, "HEAD", names_.Object(listed.key)));
    if (Unquote(r.etag) != listed.version) {
      return Status::Busy("s3: object " + listed.key + " was published again; kept");
    }
    return DeleteAll(listed.key);
  }

  Status SetPin(std::string_view key, int64_t until_ns) override {
    TQKV_RETURN_IF_ERROR(ValidateKey(key));
    if (until_ns == 0) return Delete(names_.Pin(key));
    TQKV_ASSIGN_OR_RETURN(HttpResponse h, Head(names_.Object(key)));
    if (h.code == 404) return Status::NotFound("s3: no object " + std::string(key) + " in " + Uri());
    TQKV_RETURN_IF_ERROR(client_->Check(h, "HEAD", names_.Object(key)));
    const std::string text = std::to_string(until_ns);
    HttpRequest req;
    req.method = "PUT";
    req.key = names_.Pin(key);
    req.body = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
    return client_->Check(r, "PUT pin", req.key);
  }

  Result<std::vector<SessionMeta>> ListSessions() override {
    TQKV_ASSIGN_OR_RETURN(std::vector<Listed> all, ListNames(""));
    std::map<std::string, SessionMeta> by_key;
    std::map<std::string, int64_t> access;
    std::vector<std::string> pins;
    for (const Listed& l : all) {
      const auto [dir, base] = Split(l.name);
      if (auto key = store_internal::KeyOfObjectFile(dir, base)) {
        SessionMeta& m = by_key[*key];
        m.key = *key;
        m.size = l.size;
        m.mtime_ns = l.mtime_ns;
        m.version = Unquote(l.etag);
      } else if (auto pk = store_internal::KeyOfPinFile(dir, base)) {
        pins.push_back(*pk);
      } else if (auto ak = KeyOfAccess(dir, base)) {
        access[*ak] = l.mtime_ns;
      }
    }
    // Listings give whole seconds on some servers: the exact times are in the bodies.
    for (const auto& [key, ns] : access) {
      auto it = by_key.find(key);
      if (it == by_key.end()) continue;
      it->second.atime_ns = ns;
      TQKV_ASSIGN_OR_RETURN(std::optional<int64_t> v, GetNumber(names_.Access(key)));
      if (v) it->second.atime_ns = *v;
    }
    for (const std::string& key : pins) {
      auto it = by_key.find(key);
      if (it == by_key.end()) continue;
      TQKV_ASSIGN_OR_RETURN(std::optional<int64_t> v, GetNumber(names_.Pin(key)));
      if (v) it->second.pin_until_ns = *v;  // nullopt: unpinned since the listing
    }
    std::vector<SessionMeta> out;
    for (auto& [key, m] : by_key) out.push_back(std::move(m));
    return out;
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    if (!store_internal::CouldPrefixAKey(prefix)) return out;
    TQKV_ASSIGN_OR_RETURN(std::vector<Listed> all, ListNames(prefix));
    for (const Listed& l : all) {
      const auto [dir, base] = Split(l.name);
      auto key = store_internal::KeyOfObjectFile(dir, base);
      if (!key || key->compare(0, prefix.size(), prefix) != 0) continue;
      out.push_back({*key, l.size, l.mtime_ns});
    }
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  // Aborts the multipart uploads under the prefix started at least min_age ago (writers that
  // died before Commit or Abort).
  Result<uint64_t> RemoveStaleTemps(std::chrono::seconds min_age) override {
    return SweepStaleTemps(min_age, /*remove=*/true);
  }
  Result<uint64_t> CountStaleTemps(std::chrono::seconds min_age) override {
    return SweepStaleTemps(min_age, /*remove=*/false);
  }

 private:
  // remove false: count only (gc --dry-run).
  Result<uint64_t> SweepStaleTemps(std::chrono::seconds min_age, bool remove) {
    const int64_t cutoff =
        store_internal::NowUnixNs() - static_cast<int64_t>(min_age.count()) * 1'000'000'000;
    uint64_t removed = 0;
    std::string key_marker, id_marker;
    for (int page = 0; page < 100000; ++page) {
      HttpRequest req;
      req.query = {{"uploads", ""}, {"prefix", names_.root}};
      if (!key_marker.empty()) {
        req.query.emplace_back("key-marker", key_marker);
        req.query.emplace_back("upload-id-marker", id_marker);
      }
      TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
      TQKV_RETURN_IF_ERROR(client_->Check(r, "ListMultipartUploads", names_.root));
      for (std::string_view up : s3::XmlBlocks(r.body, "Upload")) {
        const auto key = s3::XmlText(up, "Key"), id = s3::XmlText(up, "UploadId"),
                   when = s3::XmlText(up, "Initiated");
        if (!key || !id || !when) continue;
        if (key->compare(0, names_.root.size(), names_.root) != 0) continue;
        const auto ns = s3::ParseIsoTime(*when);
        if (!ns || *ns > cutoff) continue;
        if (!remove) {
          ++removed;
          continue;
        }
        HttpRequest del;
        del.method = "DELETE";
        del.key = *key;
        del.query = {{"uploadId", *id}};
        TQKV_ASSIGN_OR_RETURN(HttpResponse d, client_->Run(del));
        if (d.code == 404) continue;  // finished or aborted meanwhile
        TQKV_RETURN_IF_ERROR(client_->Check(d, "AbortMultipartUpload", *key));
        ++removed;
      }
      if (s3::XmlText(r.body, "IsTruncated").value_or("false") != "true") break;
      key_marker = s3::XmlText(r.body, "NextKeyMarker").value_or("");
      id_marker = s3::XmlText(r.body, "NextUploadIdMarker").value_or("");
      if (key_marker.empty()) break;
    }
    return removed;
  }

  const S3Config& cfg() const { return client_->cfg(); }

  Result<HttpResponse> Head(const std::string& obj) {
    HttpRequest req;
    req.method = "HEAD";
    req.key = obj;
    return client_->Run(req);
  }

  // A sidecar's body as a number; nullopt if it is gone or not a number.
  Result<std::optional<int64_t>> GetNumber(const std::string& obj) {
    HttpRequest req;
    req.key = obj;
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
    if (r.code == 404) return std::optional<int64_t>();
    TQKV_RETURN_IF_ERROR(client_->Check(r, "GET", obj));
    char* end = nullptr;
    const long long v = std::strtoll(r.body.c_str(), &end, 10);
    if (end == r.body.c_str()) return std::optional<int64_t>();
    return std::optional<int64_t>(v);
  }

  Status Delete(const std::string& obj) {
    HttpRequest req;
    req.method = "DELETE";
    req.key = obj;
    TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
    if (r.code == 404) return Status::Ok();
    return client_->Check(r, "DELETE", obj);
  }

  Status DeleteAll(std::string_view key) {
    TQKV_RETURN_IF_ERROR(Delete(names_.Object(key)));
    (void)Delete(names_.Access(key));
    return Delete(names_.Pin(key));
  }

  static std::pair<std::string, std::string> Split(const std::string& name) {
    const size_t slash = name.rfind('/');
    if (slash == std::string::npos) return {"", name};
    return {name.substr(0, slash + 1), name.substr(slash + 1)};
  }

  static std::optional<std::string> KeyOfAccess(const std::string& dir, const std::string& base) {
    if (base.size() <= 1 + kAccessSuffix.size() || base.front() != '.' ||
        base.compare(base.size() - kAccessSuffix.size(), kAccessSuffix.size(), kAccessSuffix) != 0) {
      return std::nullopt;
    }
    std::string key = dir + base.substr(1, base.size() - 1 - kAccessSuffix.size());
    if (!ValidateKey(key).ok()) return std::nullopt;
    return key;
  }

  // Every name under root + `prefix` (ListObjectsV2, all pages), relative to root.
  Result<std::vector<Listed>> ListNames(std::string_view prefix) {
    std::vector<Listed> out;
    std::string token;
    for (int page = 0; page < 1'000'000; ++page) {
      HttpRequest req;
      req.query = {{"list-type", "2"}, {"prefix", names_.root + std::string(prefix)}};
      if (!token.empty()) req.query.emplace_back("continuation-token", token);
      TQKV_ASSIGN_OR_RETURN(HttpResponse r, client_->Run(req));
      TQKV_RETURN_IF_ERROR(client_->Check(r, "ListObjectsV2", names_.root + std::string(prefix)));
      for (std::string_view c : s3::XmlBlocks(r.body, "Contents")) {
        auto name = s3::XmlText(c, "Key");
        if (!name || name->compare(0, names_.root.size(), names_.root) != 0) continue;
        Listed l;
        l.name = name->substr(names_.root.size());
        l.size = std::strtoull(s3::XmlText(c, "Size").value_or("0").c_str(), nullptr, 10);
        l.mtime_ns = s3::ParseIsoTime(s3::XmlText(c, "LastModified").value_or("")).value_or(0);
        l.etag = s3::XmlText(c, "ETag").value_or("");
        out.push_back(std::move(l));
      }
      if (s3::XmlText(r.body, "IsTruncated").value_or("false") != "true") break;
      token = s3::XmlText(r.body, "NextContinuationToken").value_or("");
      if (token.empty()) break;
    }
    return out;
  }

  std::shared_ptr<Client> client_;
  Names names_;
};

bool IsBucketName(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  return std::all_of(b.begin(), b.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
  });
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

Result<std::unique_ptr<Store>> OpenS3StoreFromUri(const StoreUri& uri) {
  S3Config cfg;
  cfg.bucket = uri.authority;
  if (!IsBucketName(cfg.bucket)) {
    return Status::InvalidArgument("s3:// bucket \"" + cfg.bucket.substr(0, 80) +
                                   "\" must be 3..63 bytes of [a-z0-9.-] (s3://BUCKET/PREFIX)");
  }
  std::string path = uri.path;
  while (!path.empty() && path.front() == '/') path.erase(0, 1);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (!path.empty() && !ValidateKey(path).ok()) {
    return Status::InvalidArgument("s3:// prefix \"" + path.substr(0, 80) +
                                   "\" must be a valid key path (" +
                                   ValidateKey(path).message() + ")");
  }
  cfg.prefix = path;
  store_internal::UriOptions opts(uri);
  const std::string* endpoint = opts.Find("endpoint");
  cfg.endpoint = endpoint != nullptr ? *endpoint : Env("AWS_ENDPOINT_URL");
  while (!cfg.endpoint.empty() && cfg.endpoint.back() == '/') cfg.endpoint.pop_back();
  if (!cfg.endpoint.empty() && cfg.endpoint.rfind("http://", 0) != 0 &&
      cfg.endpoint.rfind("https://", 0) != 0) {
    return Status::InvalidArgument("s3:// endpoint \"" + cfg.endpoint.substr(0, 100) +
                                   "\" must start with http:// or https://");
  }
  if (const std::string* region = opts.Find("region")) {
    cfg.region = *region;
  } else if (!Env("AWS_REGION").empty()) {
    cfg.region = Env("AWS_REGION");
  } else if (!Env("AWS_DEFAULT_REGION").empty()) {
    cfg.region = Env("AWS_DEFAULT_REGION");
  }
  if (cfg.region.empty() || cfg.region.size() > 40 ||
      !std::all_of(cfg.region.begin(), cfg.region.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
      })) {
    return Status::InvalidArgument("s3:// region \"" + cfg.region.substr(0, 40) + "\" is not valid");
  }
  if (const std::string* ca = opts.Find("ca")) cfg.ca = *ca;
  cfg.path_style = !cfg.endpoint.empty();
  TQKV_RETURN_IF_ERROR(opts.GetBool("path_style", &cfg.path_style));
  if (cfg.endpoint.empty() && cfg.path_style) {
    cfg.endpoint = "https://s3." + cfg.region + ".amazonaws.com";
  }
  TQKV_RETURN_IF_ERROR(opts.GetBytes("part", 5u << 20, 5ull << 30, &cfg.part_bytes));
  uint64_t v = cfg.upload_depth;
  TQKV_RETURN_IF_ERROR(opts.GetCount("depth", 1, 64, &v));
  cfg.upload_depth = static_cast<uint32_t>(v);
  v = cfg.lanes;
  TQKV_RETURN_IF_ERROR(opts.GetCount("lanes", 1, 256, &v));
  cfg.lanes = static_cast<uint32_t>(v);
  TQKV_RETURN_IF_ERROR(opts.GetBytes("get", 4096, 1ull << 30, &cfg.get_bytes));
  v = cfg.retries;
  TQKV_RETURN_IF_ERROR(opts.GetCount("retries", 0, 20, &v));
  cfg.retries = static_cast<uint32_t>(v);
  v = cfg.timeout_s;
  TQKV_RETURN_IF_ERROR(opts.GetSeconds("timeout", 1, 3600, &v));
  cfg.timeout_s = static_cast<uint32_t>(v);
  v = cfg.deadline_s;
  TQKV_RETURN_IF_ERROR(opts.GetSeconds("deadline", 1, 86400, &v));
  cfg.deadline_s = static_cast<uint32_t>(v);
  if (const std::string* io = opts.Find("io")) {
    TQKV_ASSIGN_OR_RETURN(IoMode mode, ParseIoMode(*io));
    if (mode != IoMode::kBuffered) {
      return Status::InvalidArgument("s3:// store supports only io=buffered (network I/O), not io=" +
                                     *io);
    }
  }
  TQKV_RETURN_IF_ERROR(opts.Finish());
  cfg.access_key = Env("AWS_ACCESS_KEY_ID");
  cfg.secret_key = Env("AWS_SECRET_ACCESS_KEY");
  cfg.session_token = Env("AWS_SESSION_TOKEN");
  if (cfg.access_key.empty() || cfg.secret_key.empty()) {
    return Status::InvalidArgument(
        "s3:// needs credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
        "AWS_SESSION_TOKEN for temporary ones)");
  }
  cfg.uri = "s3://" + cfg.bucket + (cfg.prefix.empty() ? "" : "/" + cfg.prefix);
  std::string q;
  if (endpoint != nullptr) q += "endpoint=" + cfg.endpoint;
  q += std::string(q.empty() ? "" : "&") + "region=" + cfg.region;
  cfg.uri += "?" + q;
  auto store = std::make_unique<S3Store>(std::make_shared<Client>(std::move(cfg)));
  TQKV_RETURN_IF_ERROR(store->Connect());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace tqkv
