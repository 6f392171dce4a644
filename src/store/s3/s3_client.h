// HTTP to an S3-compatible server through libcurl: SigV4 signing is libcurl's (CURLOPT_AWS_SIGV4),
// connections are shared by a pool of easy handles, 5xx and transport errors are retried with
// backoff, and HTTP statuses map to the library's codes. Secrets never appear in messages.
#ifndef TQKV_SRC_STORE_S3_S3_CLIENT_H_
#define TQKV_SRC_STORE_S3_S3_CLIENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tqkv/status.h"

namespace tqkv::s3 {

struct S3Config {
  std::string bucket;
  std::string prefix;    // "" or "a/b" (no leading or trailing '/')
  std::string endpoint;  // "http(s)://host[:port]"; empty: AWS, https://BUCKET.s3.REGION.amazonaws.com
  std::string region = "us-east-1";
  std::string ca;        // CA bundle file for TLS; empty: the system's
  bool path_style = true;  // endpoint/BUCKET/KEY; false: BUCKET.host/KEY
  uint64_t part_bytes = 8u << 20;  // multipart part size (S3's minimum is 5 MiB)
  uint32_t upload_depth = 4;       // parts in flight per writer
  uint32_t lanes = 8;              // parallel ranged GETs per ReadBatch
  uint64_t get_bytes = 4u << 20;   // a ReadBatch request is split into GETs of at most this
  uint32_t retries = 4;            // after the first try, for 5xx / transport errors
  uint32_t timeout_s = 20;         // one try: a stall (under 1 B/s) this long is a timeout
  // One request, all its tries: it gives up once no byte has moved (either way) for this long,
  // so a stopped server is an error within it whatever `retries` and `timeout` allow.
  uint32_t deadline_s = 45;
  std::string access_key, secret_key, session_token;  // from the environment
  std::string uri;  // for messages: no credentials
};

struct HttpRequest {
  std::string method = "GET";  // GET, PUT, POST, DELETE, HEAD
  std::string key;             // full object key in the bucket ("" for the bucket itself)
  std::vector<std::pair<std::string, std::string>> query;  // escaped and sorted by the client
  std::span<const uint8_t> body;
  std::optional<std::pair<uint64_t, uint64_t>> range;  // offset, length (length > 0)
  std::span<uint8_t> dst;      // GET with range: the bytes land here (exactly dst.size())
  // With dst: called with the bytes landed so far (a prefix of dst, never shrinking across
  // retries, which resume where the broken transfer stopped); false aborts the request.
  std::function<bool(uint64_t)> on_data;
  std::string if_match;        // ETag the object must still have
  uint32_t deadline_ms = 0;    // whole-request limit, no retries (best-effort requests); 0: none
};

struct HttpResponse {
  long code = 0;
  std::string body;       // unless dst was given
  std::string etag;       // as sent, with quotes
  int64_t mtime_s = -1;   // Last-Modified
  uint64_t length = 0;    // Content-Length
  uint64_t received = 0;  // bytes written into dst
};

class Client {
 public:
  explicit Client(S3Config cfg);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const S3Config& cfg() const { return cfg_; }
  // Runs one request with bounded retries (5xx, timeouts, broken connections), within
  // cfg().deadline_s of the last byte moved. A response is returned for every status the
  // server sent; only transport failures are errors here.
  Result<HttpResponse> Run(const HttpRequest& req);
  // `r` as a Status: 2xx OK, 403 IoError "permission denied" naming bucket and key, 404
  // NotFound, 412 Busy, anything else IoError with the server's error code.
  Status Check(const HttpResponse& r, std::string_view what, std::string_view key) const;

  struct Quiet;  // one request's deadline (s3_client.cc; public for libcurl's callback)

 private:
  struct Share;
  void* Take();            // CURL*
  void Give(void* curl);
  // `base`: bytes of req.dst's request landed by earlier tries (for on_data); `*landed`: bytes
  // this try wrote into req.dst, also when it failed.
  // `*quiet`: the request's deadline, kept across its tries; the try is aborted once no byte
  // has moved for quiet->limit.
  Result<HttpResponse> RunOnce(void* curl, const HttpRequest& req, uint64_t base,
                               std::string* transport_error, bool* retryable, uint64_t* landed,
                               Quiet* quiet);
  std::string Url(const HttpRequest& req) const;

  S3Config cfg_;
  std::unique_ptr<Share> share_;
  std::mutex mu_;
  std::vector<void*> idle_;
  // Set when a request ran out of its deadline, cleared by the next byte that moves: while
  // set, a request gets kStalledGrace, so the requests queued behind a stalled wave (read-ahead
  // blocks, the next part) fail in seconds instead of a deadline each.
  std::atomic<bool> stalled_{false};
};

// Text of the first <tag>...</tag> in xml at or after `from`; nullopt if absent. Entities
// (&amp; &lt; &gt; &quot; &apos;) decoded. `*end` (optional) receives the position after it.
std::optional<std::string> XmlText(std::string_view xml, std::string_view tag, size_t from = 0,
                                   size_t* end = nullptr);
// Every <tag>...</tag> block's inner text, in order.
std::vector<std::string_view> XmlBlocks(std::string_view xml, std::string_view tag);
// "2026-12-02T20:30:09.123Z" -> Unix ns; nullopt if malformed.
std::optional<int64_t> ParseIsoTime(std::string_view s);

}  // namespace tqkv::s3

#endif  // TQKV_SRC_STORE_S3_S3_CLIENT_H_
