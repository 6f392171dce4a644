// The chunk loop's two ways of reading: small objects whole on the calling thread (inline), others
// through the read-ahead threads. A sink must see the same chunks, bytes and layers either way,
// and a corrupt chunk must stop both before it (inline: right after the chunks before it).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/chunk_loop.h"
#include "checkpoint/session_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/settings.h"
#include "store/testing/store_testing.h"

namespace tqkv {
namespace {

// Records what it is given, copies out of the slot (the slot is reused).
class RecordingSink final : public ChunkSink {
 public:
  Status Consume(size_t, size_t index, std::span<const uint8_t> payload) override {
    events.push_back("c" + std::to_string(index));
    payloads.emplace_back(payload.begin(), payload.end());
    return Status::Ok();
  }
  Status LayerDone(uint32_t layer) override {
    events.push_back("L" + std::to_string(layer));
    return Status::Ok();
  }
  std::vector<std::string> events;
  std::vector<std::vector<uint8_t>> payloads;
};

class ChunkLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto session = testing_util::MakeSession(ModelGeometry{3, 2, 64}, 40, DType::kF16, 5);
    CheckpointOptions opts;
    opts.token_block = 16;  // several chunks per layer
    ASSERT_TRUE(Checkpoint(session->cache(), opts, store_, "s").ok());
    auto obj = store_.Open("s");
    ASSERT_TRUE(obj.ok());
    file_.resize((*obj)->Size());
    ASSERT_TRUE((*obj)->ReadAt(0, file_).ok());
  }

  Status Run(const std::string& key, bool inline_read, RecordingSink& sink, size_t* slots) {
    TQKV_ASSIGN_OR_RETURN(auto obj, store_.Open(key));
    TQKV_ASSIGN_OR_RETURN(auto reader, ContainerReader::Open(obj.get(), key));
    ChunkLoopOptions o;
    o.inflight_bytes = 1;  // threaded: two slots, refilled
    o.inline_bytes = inline_read ? (64 << 20) : 0;
    ChunkLoopStats stats;
    Status st = RunChunkLoop(*reader, sink, o, &stats);
    *slots = stats.slots;
    chunks_ = reader->chunks().size();
    return st;
  }

  MemoryStore store_;
  std::vector<uint8_t> file_;
  size_t chunks_ = 0;
};

TEST_F(ChunkLoopTest, InlineAndThreadedReadsHandTheSinkTheSame) {
  RecordingSink a, b;
  size_t slots_inline = 0, slots_threaded = 0;
  ASSERT_TRUE(Run("s", true, a, &slots_inline).ok());
  ASSERT_TRUE(Run("s", false, b, &slots_threaded).ok());
  EXPECT_EQ(slots_inline, chunks_);  // one slot per chunk: read whole
  EXPECT_EQ(slots_threaded, 2u);
  EXPECT_GT(chunks_, 6u);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.payloads, b.payloads);
}

TEST_F(ChunkLoopTest, ACorruptChunkStopsBothBeforeIt) {
  auto obj = store_.Open("s");
  auto r = ContainerReader::Open(obj->get(), "s");
  const size_t k = 5;
  auto bad = file_;
  bad[(*r)->chunks()[k].offset] ^= 0x20;
  {
    auto w = store_.Create("bad");
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(bad).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  for (bool inline_read : {true, false}) {
    RecordingSink sink;
    size_t slots = 0;
    Status st = Run("bad", inline_read, sink, &slots);
    EXPECT_TRUE(st.IsCorruption()) << st.ToString();
    EXPECT_NE(st.message().find("chunk " + std::to_string(k)), std::string::npos) << st.ToString();
    // Never the corrupt chunk or one after it. Inline: every chunk before it; the threads verify
    // a batch at a time, so good chunks sharing the bad one's batch may be withheld too.
    if (inline_read) {
      EXPECT_EQ(sink.payloads.size(), k);
    } else {
      EXPECT_LE(sink.payloads.size(), k);
    }
  }
}

}  // namespace
}  // namespace tqkv
