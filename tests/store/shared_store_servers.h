// The loopback servers of the shared-store tests (redis-server, nfs-ganesha).
//
// URIs come from TQKV_TEST_REDIS_URI / TQKV_TEST_REDIS_UNIX_URI / TQKV_TEST_NFS_URI /
// TQKV_TEST_REDIS_CLUSTER_URI, TQKV_TEST_S3_URI + TQKV_TEST_S3_ACCESS_KEY_ID /
// TQKV_TEST_S3_SECRET_ACCESS_KEY (scripts/test.sh exports them after scripts/start-test-servers.sh).
// When they are unset and the server binary is installed, the first test that needs one runs
// scripts/start-test-servers.sh itself (idempotent; stop them with scripts/stop-test-servers.sh).
// A test skips only when the binary is missing; a server that is installed but does not start
// makes the test fail. Exception: the 3-node cluster is optional; if it did not start, the
// script says why (TQKV_TEST_REDIS_CLUSTER_SKIP) and the cluster tests skip with that reason.
#ifndef TQKV_TESTS_STORE_SHARED_STORE_SERVERS_H_
#define TQKV_TESTS_STORE_SHARED_STORE_SERVERS_H_

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "store/store_test_util.h"
#include "tqkv/store.h"
#include "test_paths.h"

namespace tqkv::testing_util {

struct SharedServers {
  std::string redis, redis_unix, nfs, redis_cluster;  // empty: unavailable
  std::string redis_cluster_skip;  // why redis_cluster is empty (set whenever it is)
  std::string redis_missing, nfs_missing;  // non-empty: the binary is not installed (skip)
  std::string start_error;  // the start script failed
  // SeaweedFS's S3 gateway: URI and the one identity's credentials, or why there is none.
  std::string s3, s3_key, s3_secret, s3_skip;
};

inline bool BinaryInstalled(const char* name) {
  const std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1 || test -x /usr/sbin/" +
                          name + " -o -x /usr/bin/" + name;
  return std::system(cmd.c_str()) == 0;
}

inline const SharedServers& TestServers() {
  static SharedServers* servers = [] {
    auto* s = new SharedServers;
    if (!BinaryInstalled("redis-server")) s->redis_missing = "redis-server is not installed";
    if (!BinaryInstalled("ganesha.nfsd")) s->nfs_missing = "ganesha.nfsd is not installed";
    const char* r = std::getenv("TQKV_TEST_REDIS_URI");
    const char* ru = std::getenv("TQKV_TEST_REDIS_UNIX_URI");
    const char* n = std::getenv("TQKV_TEST_NFS_URI");
    const char* rc = std::getenv("TQKV_TEST_REDIS_CLUSTER_URI");
    const char* rc_skip = std::getenv("TQKV_TEST_REDIS_CLUSTER_SKIP");
    const bool need_redis = s->redis_missing.empty() && r == nullptr;
    const bool need_nfs = s->nfs_missing.empty() && n == nullptr;
    const bool need_cluster = s->redis_missing.empty() && rc == nullptr && rc_skip == nullptr;
    const char* s3 = std::getenv("TQKV_TEST_S3_URI");
    const char* s3_skip = std::getenv("TQKV_TEST_S3_SKIP");
    const bool need_s3 = s3 == nullptr && s3_skip == nullptr;
    if (s3 != nullptr) s->s3 = s3;
    if (s3_skip != nullptr) s->s3_skip = s3_skip;
    if (const char* k = std::getenv("TQKV_TEST_S3_ACCESS_KEY_ID")) s->s3_key = k;
    if (const char* k = std::getenv("TQKV_TEST_S3_SECRET_ACCESS_KEY")) s->s3_secret = k;
    if (r != nullptr) s->redis = r;
    if (ru != nullptr) s->redis_unix = ru;
    if (n != nullptr) s->nfs = n;
    if (rc != nullptr) s->redis_cluster = rc;
    if (rc_skip != nullptr) s->redis_cluster_skip = rc_skip;
    if (need_redis || need_nfs || need_cluster || need_s3) {
      const std::string cmd = "bash " + tqkv::test::SourceDir() + "/scripts/start-test-servers.sh";
      FILE* p = ::popen(cmd.c_str(), "r");
      char line[4096];
      while (p != nullptr && std::fgets(line, sizeof(line), p) != nullptr) {
        std::string l(line);
        while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
        auto take = [&](const char* var, std::string* out) {
          const std::string head = std::string(var) + "=";
          if (l.rfind(head, 0) != 0 || !out->empty()) return;
          std::string v = l.substr(head.size());
          if (v.size() >= 2 && v.front() == '\'' && v.back() == '\'') v = v.substr(1, v.size() - 2);
          *out = v;
        };
        take("TQKV_TEST_REDIS_URI", &s->redis);
        take("TQKV_TEST_REDIS_UNIX_URI", &s->redis_unix);
        take("TQKV_TEST_NFS_URI", &s->nfs);
        take("TQKV_TEST_REDIS_CLUSTER_URI", &s->redis_cluster);
        take("TQKV_TEST_REDIS_CLUSTER_SKIP", &s->redis_cluster_skip);
        take("TQKV_TEST_S3_URI", &s->s3);
        take("TQKV_TEST_S3_SKIP", &s->s3_skip);
        take("TQKV_TEST_S3_ACCESS_KEY_ID", &s->s3_key);
        take("TQKV_TEST_S3_SECRET_ACCESS_KEY", &s->s3_secret);
      }
      const int status = p != nullptr ? ::pclose(p) : -1;
      if (status != 0) s->start_error = cmd + " failed (status " + std::to_string(status) + ")";
    }
    if (s->redis_cluster.empty() && s->redis_cluster_skip.empty()) {
      s->redis_cluster_skip =
          !s->redis_missing.empty()
              ? s->redis_missing
              : "no loopback Redis Cluster (TQKV_TEST_REDIS_CLUSTER_URI unset and "
                "scripts/start-test-servers.sh printed none" +
                    (s->start_error.empty() ? std::string() : ": " + s->start_error) + ")";
    }
    if (s->s3.empty() && s->s3_skip.empty()) {
      s->s3_skip = "no SeaweedFS S3 gateway (TQKV_TEST_S3_URI unset and "
                   "scripts/start-test-servers.sh printed none" +
                   (s->start_error.empty() ? std::string() : ": " + s->start_error) + ")";
    }
    // The s3:// store takes its credentials from the standard environment.
    if (!s->s3.empty()) {
      ::setenv("AWS_ACCESS_KEY_ID", s->s3_key.c_str(), 1);
      ::setenv("AWS_SECRET_ACCESS_KEY", s->s3_secret.c_str(), 1);
      ::unsetenv("AWS_SESSION_TOKEN");
    }
    return s;
  }();
  return *servers;
}


// A name no other test process uses: for redis key prefixes and NFS directories.
inline std::string UniqueName(const char* tag) {
  static std::atomic<int> counter{0};
  return std::string(tag) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + std::to_string(std::rand() % 100000);
}

// "nfs://h/export?opts" + "/sub" -> "nfs://h/export/sub?opts"; extra options appended.
inline std::string WithSubdir(const std::string& uri, const std::string& sub,
                              const std::string& extra_opts = "") {
  const size_t q = uri.find('?');
  std::string base = uri.substr(0, q), query = q == std::string::npos ? "" : uri.substr(q + 1);
  if (!extra_opts.empty()) query += (query.empty() ? "" : "&") + extra_opts;
  return base + "/" + sub + (query.empty() ? "" : "?" + query);
}

// The test S3 gateway's URI with its own prefix `name`: s3://bucket/name?endpoint=...; "" if none.
inline std::string S3UriWithPrefix(const std::string& name, const std::string& extra_opts = "") {
  const auto& s = TestServers();
  if (s.s3.empty()) return "";
  return WithSubdir(s.s3, name, extra_opts);
}

// Why the s3:// tests cannot run here ("" if they can): no gateway, or a build without s3://.
inline std::string S3Skip() {
  const auto& s = TestServers();
  if (s.s3.empty()) return s.s3_skip;
  static const bool built = [] {
    auto r = OpenStore("s3://");
    return r.ok() || r.status().message().find("unknown store scheme") == std::string::npos;
  }();
  return built ? "" : "this build has no s3:// store (TQKV_ENABLE_S3=OFF: libcurl not found)";
}

// posix and every shared server, for suites parameterized over stores: each URI gets its own
// namespace under `tag`; `redis_unix` picks the single-node redis over its unix socket (else TCP);
// `redis_query` (e.g. "?chunk=64k") is appended to the redis URIs.
inline std::vector<ServerStoreParam> ServerStoreParams(std::string tag, bool redis_unix,
                                                       std::string redis_query) {
  return {
      {"posix", [] { return std::string("posix"); }, [] { return std::string(); }},
      {"nfs",
       [tag] {
         const auto& s = TestServers();
         return s.nfs.empty() ? s.nfs : WithSubdir(s.nfs, UniqueName(tag.c_str()));
       },
       [] { return TestServers().nfs_missing; }},
      {"redis",
       [tag, redis_unix, redis_query] {
         const auto& s = TestServers();
         const std::string& base = redis_unix ? s.redis_unix : s.redis;
         return base.empty() ? base : base + "/" + UniqueName(tag.c_str()) + redis_query;
       },
       [] { return TestServers().redis_missing; }},
      {"redis_cluster",
       [tag, redis_query] {
         const auto& s = TestServers();
         if (s.redis_cluster.empty()) return s.redis_cluster;
         return s.redis_cluster + "/" + UniqueName(tag.c_str()) + redis_query;
       },
       [] { return TestServers().redis_cluster_skip; }},
      {"s3",
       [tag] { return S3UriWithPrefix(UniqueName(tag.c_str())); },
       [] { return S3Skip(); }},
  };
}

}  // namespace tqkv::testing_util

#endif  // TQKV_TESTS_STORE_SHARED_STORE_SERVERS_H_
