// ThrottledStore and its throttle:// scheme: only loose lower bounds on elapsed time (the machine
// is shared and noisy).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "store/store_test_util.h"
#include "tqkv/store.h"
#include "store/testing/store_testing.h"

namespace tqkv {
namespace {

using testing_util::Pattern;
using testing_util::WriteObject;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::unique_ptr<ThrottledStore> Make(double read_bps, double write_bps, bool per_object) {
  ThrottleOptions o;
  o.read_bytes_per_sec = read_bps;
  o.write_bytes_per_sec = write_bps;
  o.per_object = per_object;
  return std::make_unique<ThrottledStore>(std::make_unique<MemoryStore>(), o);
}

TEST(ThrottledStoreTest, WritesTakeAtLeastBytesOverRate) {
  constexpr double kRate = 40e6;
  auto store = Make(0, kRate, false);
  const auto data = Pattern(1, 8'000'000);  // 200 ms at 40 MB/s
  const auto t0 = Clock::now();
  ASSERT_TRUE(WriteObject(store.get(), "w", data, 1 << 20).ok());
  const double elapsed = Seconds(Clock::now() - t0);
  EXPECT_GE(elapsed, 0.8 * data.size() / kRate) << "elapsed " << elapsed << " s";
}

TEST(ThrottledStoreTest, ReadsTakeAtLeastBytesOverRate) {
  constexpr double kRate = 50e6;
  auto store = Make(kRate, 0, false);
  const auto data = Pattern(2, 10'000'000);  // 200 ms at 50 MB/s
  ASSERT_TRUE(WriteObject(store.get(), "r", data).ok());  // writes unlimited
  auto r = store->Open("r");
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> buf(data.size());
  const auto t0 = Clock::now();
  for (size_t off = 0; off < data.size(); off += 1'000'000) {
    ASSERT_TRUE((*r)->ReadAt(off, std::span<uint8_t>(buf.data() + off, 1'000'000)).ok());
  }
  const double elapsed = Seconds(Clock::now() - t0);
  EXPECT_GE(elapsed, 0.8 * data.size() / kRate) << "elapsed " << elapsed << " s";
  EXPECT_TRUE(buf == data);
}

TEST(ThrottledStoreTest, ReadBatchIsThrottledToo) {
  constexpr double kRate = 50e6;
  auto store = Make(kRate, 0, false);
  const auto data = Pattern(3, 10'000'000);
  ASSERT_TRUE(WriteObject(store.get(), "b", data).ok());
  auto r = store->Open("b");
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> buf(data.size());
  std::vector<ReadRequest> reqs;
  for (size_t off = 0; off < data.size(); off += 2'500'000) {
    reqs.push_back({off, std::span<uint8_t>(buf.data() + off, 2'500'000)});
  }
  const auto t0 = Clock::now();
  ASSERT_TRUE((*r)->ReadBatch(reqs).ok());
  const double elapsed = Seconds(Clock::now() - t0);
  EXPECT_GE(elapsed, 0.8 * data.size() / kRate) << "elapsed " << elapsed << " s";
  EXPECT_TRUE(buf == data);
}

TEST(ThrottledStoreTest, SharedBucketSplitsBandwidthBetweenReaders) {
  constexpr double kRate = 40e6;
  auto store = Make(kRate, 0, /*per_object=*/false);
  const auto data = Pattern(4, 4'000'000);
  ASSERT_TRUE(WriteObject(store.get(), "a", data).ok());
  ASSERT_TRUE(WriteObject(store.get(), "b", data).ok());
  const auto t0 = Clock::now();
  std::vector<std::thread> readers;
  for (const char* key : {"a", "b"}) {
    readers.emplace_back([&store, key] {
      auto r = store->Open(key);
      ASSERT_TRUE(r.ok());
      std::vector<uint8_t> buf(500'000);
      for (uint64_t off = 0; off < (*r)->Size(); off += buf.size()) {
        ASSERT_TRUE((*r)->ReadAt(off, buf).ok());
      }
    });
  }
  for (auto& t : readers) t.join();
  const double elapsed = Seconds(Clock::now() - t0);
  // 8 MB through one 40 MB/s link: 200 ms.
  EXPECT_GE(elapsed, 0.8 * 2 * data.size() / kRate) << "elapsed " << elapsed << " s";
}

TEST(ThrottledStoreTest, UnlimitedPassesThroughAndKeepsContract) {
  auto store = Make(0, 0, true);
  const auto data = Pattern(5, 1 << 20);
  ASSERT_TRUE(WriteObject(store.get(), "x", data).ok());
  auto r = store->Open("x");
  ASSERT_TRUE(r.ok());
  std::vector<uint8_t> buf(data.size());
  ASSERT_TRUE((*r)->ReadAt(0, buf).ok());
  EXPECT_TRUE(buf == data);
  EXPECT_TRUE((*r)->ReadAt(1, buf).IsCorruption());
  EXPECT_EQ(store->Name(), "throttled");
  EXPECT_EQ(store->Uri(), "throttle://?store=memory%3A%2F%2F&read_rate=0&write_rate=0&per_object=1");
}

// throttle:// (the test scheme, RegisterTestingStoreSchemes) opens the same decorator.
Result<std::unique_ptr<Store>> OpenThrottle(const std::string& uri) {
  EXPECT_TRUE(RegisterTestingStoreSchemes().ok());  // idempotent
  return OpenStore(uri);
}

TEST(ThrottleSchemeTest, OpensTheDecoratorWithItsRates) {
  auto store = OpenThrottle("throttle://?store=memory%3A%2F%2F&write_rate=40MB");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto* throttled = dynamic_cast<ThrottledStore*>(store->get());
  ASSERT_NE(throttled, nullptr);
  EXPECT_EQ(throttled->options().read_bytes_per_sec, 0);
  EXPECT_EQ(throttled->options().write_bytes_per_sec, 40e6);
  EXPECT_FALSE(throttled->options().per_object);
  const auto data = Pattern(6, 8'000'000);  // 200 ms at 40 MB/s
  const auto t0 = Clock::now();
  ASSERT_TRUE(WriteObject(store->get(), "w", data, 1 << 20).ok());
  const double elapsed = Seconds(Clock::now() - t0);
  EXPECT_GE(elapsed, 0.8 * data.size() / 40e6) << "elapsed " << elapsed << " s";
}

TEST(ThrottleSchemeTest, InnerUriKeepsItsOptionsAndUriRoundTrips) {
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  // The inner "<dir>?create=1&chunk=64k", percent-encoded into one option value.
  const std::string uri = "throttle://?store=" + dir.path() +
                          "%3Fcreate%3D1%26chunk%3D64k&read_rate=0.05GB&per_object=1&burst=1MiB";
  auto store = OpenThrottle(uri);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto* throttled = dynamic_cast<ThrottledStore*>(store->get());
  ASSERT_NE(throttled, nullptr);
  EXPECT_EQ(throttled->options().read_bytes_per_sec, 50e6);
  EXPECT_TRUE(throttled->options().per_object);
  EXPECT_EQ(throttled->options().burst_bytes, 1u << 20);
  EXPECT_NE(throttled->base()->Uri().find("chunk=65536"), std::string::npos)
      << throttled->base()->Uri();
  ASSERT_TRUE(WriteObject(store->get(), "x", Pattern(7, 1000)).ok());
  auto again = OpenStore((*store)->Uri());  // Uri() opens an equal store
  ASSERT_TRUE(again.ok()) << (*store)->Uri() << ": " << again.status().ToString();
  EXPECT_EQ((*again)->Uri(), (*store)->Uri());
  auto read = testing_util::ReadObject(again->get(), "x");
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(*read == Pattern(7, 1000));
}

TEST(ThrottleSchemeTest, RefusesBadUris) {
  for (const char* uri : {
           "throttle://?read_rate=1MB",                          // no store
           "throttle://?store=memory%3A%2F%2F&rate=1MB",         // unknown option
           "throttle://?store=memory%3A%2F%2F&read_rate=fast",   // not a byte size
           "throttle://?store=memory%3A%2F%2F&write_rate=-1",    // no sign
           "throttle://?store=memory%3A%2F%2F&per_object=yes",   // 0 or 1
           "throttle://?store=memory%3A%2F%2F&burst=0",          // burst >= 1 B
           "throttle://host?store=memory%3A%2F%2F",              // no host
           "throttle:///tmp/kv?read_rate=1MB",                   // the store is store=, no path
           "throttle://?store=memory%3A%2F%2F%3Fio%3Ddirect",    // memory:// refuses io=
           "throttle://?store=nosuch%3A%2F%2Fx",                 // unknown inner scheme
       }) {
    auto store = OpenThrottle(uri);
    EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << uri << ": " << store.status().ToString();
  }
}

}  // namespace
}  // namespace tqkv
