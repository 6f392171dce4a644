// libcurl under the s3:// store (s3_client.h).
#include "store/s3/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>

namespace tqkv::s3 {
namespace {

// AWS's URI encoding (SigV4 canonical form): unreserved bytes as they are, the rest %XX.
std::string AwsEscape(std::string_view s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    const bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.' || c == '~';
    if (keep) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[(static_cast<unsigned char>(c) >> 4) & 0xf]);
      out.push_back(kHex[static_cast<unsigned char>(c) & 0xf]);
    }
  }
  return out;
}

bool Retryable(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_COULDNT_RESOLVE_HOST:
      return true;
    default:
      return false;
  }
}

struct Transfer {
  const HttpRequest* req;
  HttpResponse* resp;
  CURL* curl;
  uint64_t base = 0;  // bytes of the whole request landed by earlier tries
  bool overflow = false;
  bool aborted = false;
  Client::Quiet* quiet = nullptr;  // the request's deadline
  curl_off_t down = 0;             // bytes received in this try
  bool stalled = false;            // aborted by the deadline
};

}  // namespace

// One request's deadline, across its tries.
struct Client::Quiet {
  std::chrono::steady_clock::time_point since;  // a byte last moved, or the request began
  std::chrono::steady_clock::duration limit;    // how long no byte may move
  // Bytes sent by the furthest try: a retry sends the body again from its start, into kernel
  // buffers that take megabytes from a stopped server, and that is no progress.
  curl_off_t up_high = 0;
  std::atomic<bool>* stalled = nullptr;         // the client's (Client::stalled_)
};

namespace {

// libcurl calls it about once a second, and on every transfer, connecting included.
int OnProgress(void* user, curl_off_t, curl_off_t down, curl_off_t, curl_off_t up) {
  auto* t = static_cast<Transfer*>(user);
  Client::Quiet* q = t->quiet;
  const auto now = std::chrono::steady_clock::now();
  bool moved = false;
  if (down > t->down) {
    t->down = down;
    moved = true;
  }
  if (up > q->up_high) {
    q->up_high = up;
    moved = true;
  }
  if (moved) {
    q->since = now;
    q->stalled->store(false, std::memory_order_relaxed);
  }
  t->stalled = now - q->since >= q->limit;
  return t->stalled ? 1 : 0;
}

// While the client knows its server stalled past a deadline, a request's deadline is this.
constexpr std::chrono::seconds kStalledGrace{2};

// The error of a request that ran out of its deadline; `shortened`: kStalledGrace's.
std::string DeadlineError(std::chrono::steady_clock::duration limit, bool shortened) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(limit).count();
  return "no byte moved for " + std::to_string(s) + " s (" +
         (shortened ? "the server had already stalled past the store URI's deadline)"
                    : "the store URI's deadline)");
}

size_t OnWrite(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  long code = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
  const bool into_dst = !t->req->dst.empty() && code >= 200 && code < 300;
  if (!into_dst) {
    if (t->resp->body.size() + len > (64u << 20)) {  // a listing page or error is far smaller
      t->overflow = true;
      return 0;
    }
    t->resp->body.append(data, len);
    return len;
  }
  if (t->resp->received + len > t->req->dst.size()) {
    t->overflow = true;
    return 0;
  }
  std::memcpy(t->req->dst.data() + t->resp->received, data, len);
  t->resp->received += len;
  if (t->req->on_data && !t->req->on_data(t->base + t->resp->received)) {
    t->aborted = true;
    return 0;
  }
  return len;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  std::string_view line(data, len);
  if (line.size() > 5 && (line.substr(0, 5) == "ETag:" || line.substr(0, 5) == "etag:" ||
                          line.substr(0, 5) == "Etag:")) {
    std::string_view v = line.substr(5);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) {
      v.remove_suffix(1);
    }
    t->resp->etag = std::string(v);
  }
  return len;
}

}  // namespace

struct Client::Share {
  CURLSH* sh = nullptr;
  std::mutex locks[CURL_LOCK_DATA_LAST];
  static void Lock(CURL*, curl_lock_data d, curl_lock_access, void* user) {
    static_cast<Share*>(user)->locks[d].lock();
  }
  static void Unlock(CURL*, curl_lock_data d, void* user) {
    static_cast<Share*>(user)->locks[d].unlock();
  }
  Share() {
    static const bool inited = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }();
    (void)inited;
    sh = curl_share_init();
    curl_share_setopt(sh, CURLSHOPT_LOCKFUNC, &Share::Lock);
    curl_share_setopt(sh, CURLSHOPT_UNLOCKFUNC, &Share::Unlock);
    curl_share_setopt(sh, CURLSHOPT_USERDATA, this);
    // One connection cache for every handle of the store: connections are reused across
    // requests, writers and read lanes.
    curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  }
  ~Share() { curl_share_cleanup(sh); }
};

Client::Client(S3Config cfg) : cfg_(std::move(cfg)), share_(std::make_unique<Share>()) {}

Client::~Client() {
  for (void* c : idle_) curl_easy_cleanup(static_cast<CURL*>(c));
}

void* Client::Take() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      void* c = idle_.back();
      idle_.pop_back();
      return c;
    }
  }
  return curl_easy_init();
}

void Client::Give(void* curl) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(curl);
}

std::string Client::Url(const HttpRequest& req) const {
  std::string url;
  if (cfg_.endpoint.empty()) {
    url = "https://" + cfg_.bucket + ".s3." + cfg_.region + ".amazonaws.com/";
  } else if (cfg_.path_style) {
    url = cfg_.endpoint + "/" + cfg_.bucket + "/";
  } else {
    const size_t at = cfg_.endpoint.find("://");
    url = cfg_.endpoint.substr(0, at + 3) + cfg_.bucket + "." + cfg_.endpoint.substr(at + 3) + "/";
  }
  url += req.key;  // keys are [A-Za-z0-9._-/]: nothing to escape
  auto q = req.query;
  std::sort(q.begin(), q.end());  // SigV4's canonical order
  for (size_t i = 0; i < q.size(); ++i) {
    url += (i == 0 ? "?" : "&") + AwsEscape(q[i].first) + "=" + AwsEscape(q[i].second);
  }
  return url;
}

Result<HttpResponse> Client::RunOnce(void* handle, const HttpRequest& req, uint64_t base,
                                     std::string* transport_error, bool* retryable,
                                     uint64_t* landed, Quiet* quiet) {
  CURL* curl = static_cast<CURL*>(handle);
  curl_easy_reset(curl);
  HttpResponse resp;
  Transfer t{&req, &resp, curl, base};
  t.quiet = quiet;
  const std::string url = Url(req);
  const std::string sigv4 = "aws:amz:" + cfg_.region + ":s3";
  curl_easy_setopt(curl, CURLOPT_SHARE, share_->sh);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(curl, CURLOPT_USERNAME, cfg_.access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, cfg_.secret_key.c_str());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
  // A stalled transfer (under 1 byte/s for timeout_s) is a timeout; big ones may take long.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(cfg_.timeout_s));
  curl_easy_setopt(curl, CURLOPT_FILETIME, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &OnWrite);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  // Bulk reads: fewer, larger receives and write callbacks than libcurl's 16 KiB default.
  if (!req.dst.empty()) curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 256L << 10);
  if (!cfg_.ca.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, cfg_.ca.c_str());
  if (req.deadline_ms > 0) {
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(req.deadline_ms));
  }
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  std::string token, range, match;
  if (!cfg_.session_token.empty()) {
    token = "x-amz-security-token: " + cfg_.session_token;
    headers = curl_slist_append(headers, token.c_str());
  }
  if (req.range) {
    range = "Range: bytes=" + std::to_string(req.range->first) + "-" +
            std::to_string(req.range->first + req.range->second - 1);
    headers = curl_slist_append(headers, range.c_str());
  }
  if (!req.if_match.empty()) {
    match = "If-Match: " + req.if_match;
    headers = curl_slist_append(headers, match.c_str());
  }
  if (req.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT" || req.method == "POST") {
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS,
                     req.body.empty() ? "" : reinterpret_cast<const char*>(req.body.data()));
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  } else if (req.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  *landed = resp.received;
  if (t.aborted) {
    *retryable = false;
    return Status::IoError("s3: " + req.method + " " + req.key + " aborted by its reader");
  }
  if (t.stalled) {
    *retryable = false;
    *transport_error =
        DeadlineError(quiet->limit, quiet->limit < std::chrono::seconds(cfg_.deadline_s));
    return Status::IoError(*transport_error);
  }
  if (rc != CURLE_OK && !(t.overflow && rc == CURLE_WRITE_ERROR)) {
    *retryable = Retryable(rc);
    *transport_error = curl_easy_strerror(rc);
    return Status::IoError(*transport_error);
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.code);
  if (t.overflow) {
    *retryable = false;
    return Status::Corruption("s3: the server sent more bytes than asked for (" + std::string(req.method) +
                              " " + req.key + ")");
  }
  curl_off_t ft = -1, cl = -1;
  if (curl_easy_getinfo(curl, CURLINFO_FILETIME_T, &ft) == CURLE_OK) resp.mtime_s = ft;
  if (curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl) == CURLE_OK && cl >= 0) {
    resp.length = static_cast<uint64_t>(cl);
  }
  *retryable = resp.code >= 500 || resp.code == 429;
  return resp;
}

Result<HttpResponse> Client::Run(const HttpRequest& req) {
  void* curl = Take();
  if (curl == nullptr) return Status::ResourceExhausted("s3: curl_easy_init failed");
  std::string err;
  Result<HttpResponse> last = Status::IoError("s3: no attempt");
  thread_local std::mt19937 rng(std::random_device{}());
  // A ranged GET into dst that broke after some bytes resumes after them: on_data never goes
  // back, and the bytes already there are the same object's (If-Match).
  HttpRequest rest;
  const bool resumable = req.range.has_value() && !req.dst.empty();
  uint64_t done = 0;
  uint32_t tries = 0;
  Quiet quiet;
  quiet.since = std::chrono::steady_clock::now();
  quiet.limit = std::chrono::seconds(cfg_.deadline_s);
  if (stalled_.load(std::memory_order_relaxed)) {
    quiet.limit = std::min<std::chrono::steady_clock::duration>(quiet.limit, kStalledGrace);
  }
  quiet.stalled = &stalled_;
  bool timed_out = false;
  for (uint32_t attempt = 0; attempt <= cfg_.retries; ++attempt) {
    if (attempt > 0) {
      const int ms = std::min(2000, 50 << (attempt - 1));
      const auto left = quiet.limit - (std::chrono::steady_clock::now() - quiet.since);
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          std::chrono::milliseconds(ms / 2 + rng() % (ms / 2 + 1)), left));
      if (std::chrono::steady_clock::now() - quiet.since >= quiet.limit) {
        err = DeadlineError(quiet.limit, quiet.limit < std::chrono::seconds(cfg_.deadline_s));
        last = Status::IoError(err);
        timed_out = true;
        break;
      }
    }
    ++tries;
    if (done > 0) {
      rest = req;
      rest.range = std::make_pair(req.range->first + done, req.range->second - done);
      rest.dst = req.dst.subspan(done);
    }
    bool retry = false;
    uint64_t landed = 0;
    last = RunOnce(curl, done > 0 ? rest : req, done, &err, &retry, &landed, &quiet);
    timed_out = !last.ok() && std::chrono::steady_clock::now() - quiet.since >= quiet.limit;
    if (last.ok()) last->received += done;
    if (!retry || req.deadline_ms > 0) break;
    // Every byte landed yet the transfer failed: the next try is the whole request again.
    if (resumable) done = done + landed < req.dst.size() ? done + landed : 0;
  }
  Give(curl);
  if (timed_out) stalled_.store(true, std::memory_order_relaxed);
  if (!last.ok() && !err.empty()) {
    return Status::IoError("s3: " + req.method + " " + cfg_.bucket + "/" + req.key +
                           " unavailable after " + std::to_string(tries) + " tries: " + err);
  }
  return last;
}

Status Client::Check(const HttpResponse& r, std::string_view what, std::string_view key) const {
  if (r.code >= 200 && r.code < 300) return Status::Ok();
  const std::string code = XmlText(r.body, "Code").value_or("");
  const std::string where = "bucket " + cfg_.bucket + ", key " + std::string(key);
  const std::string server =
      " (HTTP " + std::to_string(r.code) + (code.empty() ? "" : " " + code) + ")";
  const std::string head = "s3: " + std::string(what) + ": ";
  if (r.code == 403) {
    return Status::IoError(head + "permission denied for " + where + server +
                           ": check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the policy");
  }
  if (r.code == 404) return Status::NotFound(head + "no such object, " + where + server);
  if (r.code == 412) return Status::Busy(head + "precondition failed, " + where + server);
  if (r.code >= 500 || r.code == 429) {
    return Status::IoError(head + "server unavailable after " + std::to_string(cfg_.retries + 1) +
                           " tries, " + where + server);
  }
  return Status::IoError(head + where + server);
}

std::optional<std::string> XmlText(std::string_view xml, std::string_view tag, size_t from,
                                   size_t* end) {
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  const size_t a = xml.find(open, from);
  if (a == std::string_view::npos) return std::nullopt;
  const size_t b = xml.find(close, a + open.size());
  if (b == std::string_view::npos) return std::nullopt;
  if (end != nullptr) *end = b + close.size();
  std::string_view raw = xml.substr(a + open.size(), b - a - open.size());
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out.push_back(raw[i]);
      continue;
    }
    static const std::pair<std::string_view, char> kEnt[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''},
        {"&#34;", '"'}, {"&#39;", '\''}};
    bool done = false;
    for (const auto& [ent, ch] : kEnt) {
      if (raw.substr(i, ent.size()) == ent) {
        out.push_back(ch);
        i += ent.size() - 1;
        done = true;
        break;
      }
    }
    if (!done) out.push_back('&');
  }
  return out;
}

std::vector<std::string_view> XmlBlocks(std::string_view xml, std::string_view tag) {
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (true) {
    const size_t a = xml.find(open, pos);
    if (a == std::string_view::npos) break;
    const size_t b = xml.find(close, a + open.size());
    if (b == std::string_view::npos) break;
    out.push_back(xml.substr(a + open.size(), b - a - open.size()));
    pos = b + close.size();
  }
  return out;
}

std::optional<int64_t> ParseIsoTime(std::string_view s) {
  int y, mo, d, h, mi, sec;
  const std::string t(s.substr(0, 64));
  if (std::sscanf(t.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &sec) != 6) {
    return std::nullopt;
  }
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  const time_t secs = timegm(&tm);
  int64_t frac_ns = 0;
  if (t.size() > 19 && t[19] == '.') {
    int64_t scale = 100'000'000;
    for (size_t i = 20; i < t.size() && t[i] >= '0' && t[i] <= '9' && scale > 0; ++i) {
      frac_ns += (t[i] - '0') * scale;
      scale /= 10;
    }
  }
  return static_cast<int64_t>(secs) * 1'000'000'000 + frac_ns;
}

}  // namespace tqkv::s3
