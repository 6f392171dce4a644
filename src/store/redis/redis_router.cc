// The single-node router: every key goes to the node of the URI.
#include "store/redis/redis_router.h"

namespace tqkv::redis {
namespace {

class SingleNodeRouter final : public Router {
 public:
  explicit SingleNodeRouter(RedisConfig cfg) : pool_(std::make_shared<Pool>(std::move(cfg))) {}

  const RedisConfig& cfg() const override { return pool_->cfg(); }
  bool FollowsRedirects() const override { return false; }
  Result<std::shared_ptr<Pool>> PoolFor(std::string_view) override { return pool_; }

  Result<Reply> Exec(std::string_view, const std::vector<std::string_view>& args,
                     std::string_view what) override {
    TQKV_ASSIGN_OR_RETURN(redisContext * c, pool_->Get());
    Lease lease(pool_, c);
    return Command(lease, args, what);
  }

  Result<std::vector<std::shared_ptr<Pool>>> Primaries() override {
    return std::vector<std::shared_ptr<Pool>>{pool_};
  }

  Status Connect() override { return Exec("", {"PING"}, "PING").status(); }

 private:
  std::shared_ptr<Pool> pool_;
};

}  // namespace

std::shared_ptr<Router> MakeSingleNodeRouter(RedisConfig cfg) {
  return std::make_shared<SingleNodeRouter>(std::move(cfg));
}

}  // namespace tqkv::redis
