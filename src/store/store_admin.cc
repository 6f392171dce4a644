// Session admin: the store's own admin side (posix, nfs, redis) and the garbage collector.
#include "tqkv/store_admin.h"

#include <algorithm>
#include <string>

#include "store/store_internal.h"

namespace tqkv {
namespace {

// Forwards to the SessionAdmin the store object itself implements (posix, nfs, redis).
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
  return Status::Unsupported("session management is not available for " +
                             std::string(store->Name()) + " stores (posix, nfs, redis and s3 have it)");
}

Result<GcReport> CollectGarbage(Store* store, const GcOptions& o) {
  // A negative age would sweep the temps of live writers (and a negative TTL expire everything).
  if (o.temp_min_age.count() < 0 || o.ttl.count() < 0) {
    return Status::InvalidArgument("gc: temp_min_age and ttl must not be negative (got " +
                                   std::to_string(o.temp_min_age.count()) + " s and " +
                                   std::to_string(o.ttl.count()) + " s)");
  }
  GcReport rep;
  TQKV_ASSIGN_OR_RETURN(auto admin, OpenSessionAdmin(store));
  TQKV_ASSIGN_OR_RETURN(rep.temps_removed, o.dry_run ? store->CountStaleTemps(o.temp_min_age)
                                                      : store->RemoveStaleTemps(o.temp_min_age));
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
