// The GPU restore's host half without a GPU: the chunk loop and the device sink
// (src/checkpoint/device_sink.h) over a host fake of the device. The fake runs the planned
// operations with the CPU codec on the bytes it was given by Upload, so a wrong plan shows up as
// a tensor that differs from the host restore; and a chunk with a bad checksum or padding must be
// refused before any byte of it reaches the device.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/chunk_loop.h"
#include "checkpoint/device_sink.h"
#include "checkpoint/key_means.h"
#include "checkpoint/session_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/codec.h"
#include "tqkv/container.h"
#include "store/testing/store_testing.h"

namespace tqkv {
namespace {

// A device in host memory: slots, "device" copies of them made by Upload, the metadata array and
// the output tensors (canonical layout, f16).
class FakeDevice final : public RestoreDevice {
 public:
  FakeDevice(const ContainerHeader& h, const DevicePlan& plan) : h_(h) {
    meta_.assign(plan.meta_total, 0);
    means_.assign(plan.means_total, 0);
    tensors_.assign(2 * h.geometry.layers,
                    std::vector<uint8_t>(h.tokens * h.geometry.token_elems() * 2, 0));
    for (const CodecParams& p : plan.codecs) codecs_.push_back(std::move(Codec::FromParams(p)).value());
  }
  Result<std::vector<std::span<uint8_t>>> AllocateSlots(size_t count, size_t bytes) override {
    host_.assign(count, std::vector<uint8_t>(bytes, 0));
    dev_.assign(count, std::vector<uint8_t>(bytes, 0xEE));
    held_.assign(count, false);
    std::vector<std::span<uint8_t>> out;
    for (auto& s : host_) out.emplace_back(s);
    return out;
  }
  Status Upload(size_t slot, size_t offset, size_t bytes) override {
    EXPECT_FALSE(held_[slot]) << "a slot was refilled before it was retired";
    std::memcpy(dev_[slot].data() + offset, host_[slot].data() + offset, bytes);
    ++uploads;
    return Status::Ok();
  }
  Status Run(size_t slot, std::span<const DeviceOp> ops) override {
    for (const DeviceOp& op : ops) TQKV_RETURN_IF_ERROR(RunOp(dev_[slot].data(), op));
    held_[slot] = true;
    ++runs;
    return Status::Ok();
  }
  Status LayerReady(uint32_t layer) override {
    layers_ready.push_back(layer);
    return Status::Ok();
  }
  size_t held_slots() const override { return 1; }
  // The chunk loop retires the slot of a chunk the sink refused too (a copy may be in flight).
  Status Retire(size_t slot) override {
    if (!held_[slot]) ++unrun_retires;
    held_[slot] = false;
    return Status::Ok();
  }

  const std::vector<uint8_t>& tensor(uint32_t layer, int kv) const { return tensors_[2 * layer + kv]; }
  int uploads = 0, runs = 0, centered_ops = 0, means_stored = 0, unrun_retires = 0;
  std::vector<uint32_t> layers_ready;

 private:
  // What the kernels do, with the CPU codec: head-major sources, canonical rows.
  Status RunOp(const uint8_t* dev, const DeviceOp& op) {
    if (op.kind == DeviceOp::kStoreMeta) {
      std::memcpy(meta_.data() + op.meta_offset, dev + op.src_offset, op.bytes);
      return Status::Ok();
    }
    if (op.kind == DeviceOp::kStoreMeans) {
      std::memcpy(means_.data() + op.means_offset, dev + op.src_offset, op.bytes);
      ++means_stored;
      return Status::Ok();
    }
    const Codec& codec = *codecs_[op.codec];
    const size_t heads = h_.geometry.kv_heads, d = h_.geometry.head_dim, row = heads * d;
    const size_t n = op.token_count, code = codec.code_bytes(), mb = codec.group_meta_bytes();
    uint8_t* out = tensors_[2 * op.layer + op.kv].data() + op.token_begin * row * 2;
    for (size_t hd = 0; hd < heads; ++hd) {
      std::span<const uint8_t> meta;
      if (op.meta_offset != DeviceOp::kNoMeta) meta = {meta_.data() + op.meta_offset + hd * mb, mb};
      if (op.means_offset != DeviceOp::kNoMeta) {
        ++centered_ops;
        const uint64_t layer_bytes = KeyMeanValues(h_, op.layer) * DTypeSize(h_.key_mean_dtype);
        const KeyMeans means =
            KeyMeansAsF32(h_, op.layer, {means_.data() + op.means_offset, layer_bytes});
        TQKV_RETURN_IF_ERROR(DecodeCenteredKeys(h_, op.layer, codec, means, static_cast<uint32_t>(hd),
                                                op.token_begin, n,
                                                {dev + op.src_offset + hd * n * code, n * code},
                                                meta, out + hd * d * 2, DType::kF16, row, nullptr));
        continue;
      }
      TQKV_RETURN_IF_ERROR(codec.Decode({dev + op.src_offset + hd * n * code, n * code}, n, meta,
                                        out + hd * d * 2, DType::kF16, row, nullptr));
    }
    return Status::Ok();
  }

  const ContainerHeader& h_;
  std::vector<std::unique_ptr<Codec>> codecs_;
  std::vector<std::vector<uint8_t>> host_, dev_;
  std::vector<bool> held_;
  std::vector<uint8_t> meta_, means_;
  std::vector<std::vector<uint8_t>> tensors_;
};

class DeviceSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelGeometry g{3, 2, 64};
    session_ = testing_util::MakeSession(g, 70, DType::kF16, 11);
    CheckpointOptions opts;
    opts.codec = ParseCodecSpec("tq2.5").value();  // split: group metadata chunks
    opts.layer_overrides.push_back(ParseLayerCodec("1:fp16").value());  // raw codes
    opts.token_block = 32;
    opts.exact_head = 2;
    opts.exact_tail = 3;
    opts.key_mean_block = 16;  // 5 mean blocks, two code chunks: runs cross both boundaries
    ASSERT_TRUE(Checkpoint(session_->cache(), opts, store_, "s").ok());
    auto obj = store_.Open("s");
    ASSERT_TRUE(obj.ok());
    file_.resize((*obj)->Size());
    ASSERT_TRUE((*obj)->ReadAt(0, file_).ok());
  }

  // Publishes `bytes` as `key`.
  void Put(const std::string& key, const std::vector<uint8_t>& bytes) {
    auto w = store_.Create(key);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(bytes).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }

  // Runs the device restore of `key` over a fake device; the fake is kept for inspection.
  Status RunOnFake(const std::string& key) {
    TQKV_ASSIGN_OR_RETURN(object_, store_.Open(key));
    TQKV_ASSIGN_OR_RETURN(reader_, ContainerReader::Open(object_.get(), key));
    TQKV_ASSIGN_OR_RETURN(plan_, MakeDevicePlan(reader_->header()));
    device_ = std::make_unique<FakeDevice>(reader_->header(), plan_);
    ChunkLoopOptions loop;
    loop.inflight_bytes = 1;  // two slots: each is refilled, so holding and retiring matter
    loop.inline_bytes = 0;
    return RunDeviceRestore(*reader_, plan_, *device_, loop, key);
  }

  // Offset of the first padding byte after chunk `i` (chunks are padded to 4 KiB).
  uint64_t PaddingAfter(size_t i) {
    auto obj = store_.Open("s");
    auto r = ContainerReader::Open(obj->get(), "s");
    const ChunkEntry& e = (*r)->chunks()[i];
    EXPECT_GT((*r)->ChunkExtent(i), e.size);
    return e.offset + e.size;
  }

  MemoryStore store_;
  std::unique_ptr<KvCacheBuffer> session_;
  std::vector<uint8_t> file_;
  std::unique_ptr<ReadableObject> object_;
  std::unique_ptr<ContainerReader> reader_;
  DevicePlan plan_;
  std::unique_ptr<FakeDevice> device_;
};

TEST_F(DeviceSinkTest, PlannedOperationsReproduceTheHostRestore) {
  ASSERT_TRUE(RunOnFake("s").ok());
  EXPECT_EQ(device_->uploads, static_cast<int>(reader_->chunks().size()));
  EXPECT_EQ(device_->unrun_retires, 0);
  EXPECT_EQ(device_->layers_ready, (std::vector<uint32_t>{0, 1, 2}));
  auto host = Restore(store_, "s", RestoreOptions{});
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  const KvCache& want = (*host)->cache();
  for (uint32_t l = 0; l < 3; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto& got = device_->tensor(l, kv);
      ASSERT_EQ(std::memcmp(got.data(), want.tensor(l, kv), got.size()), 0)
          << "layer " << l << " kv " << kv;
    }
  }
}

// Separate K and V codecs (format version 5): each op gets its tensor's codec and masks (K's
// masks, then V's, in the group-meta chunk), key means stay on K.
TEST_F(DeviceSinkTest, KvCodecsReproduceTheHostRestore) {
  CheckpointOptions opts;
  SetCodec(opts, ParseKvCodecSpec("k:tq2.5/v:tq3").value());  // only K is split in layers 0, 2
  opts.layer_overrides.push_back(ParseLayerCodec("1:k:fp16/v:tq3.5").value());  // only V split
  opts.token_block = 32;
  opts.exact_head = 1;
  opts.key_mean_block = 16;
  ASSERT_TRUE(Checkpoint(session_->cache(), opts, store_, "kv").ok());
  ASSERT_TRUE(RunOnFake("kv").ok());
  const ContainerHeader& h = reader_->header();
  ASSERT_TRUE(HasSeparateKvCodecs(h));
  EXPECT_EQ(plan_.meta_at[1], 2u * 8);              // layer 0: two K masks of 8 bytes
  EXPECT_EQ(plan_.meta_at[2], plan_.meta_at[1] + 2u * 8);  // layer 1: two V masks
  EXPECT_EQ(plan_.means_at[1], DevicePlan::kNoMeans);       // layer 1's keys are raw
  auto host = Restore(store_, "kv", RestoreOptions{});
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  for (uint32_t l = 0; l < 3; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto& got = device_->tensor(l, kv);
      ASSERT_EQ(std::memcmp(got.data(), (*host)->cache().tensor(l, kv), got.size()), 0)
          << "layer " << l << " kv " << kv;
    }
  }
}

// kl codecs (group metadata of 5 * head_dim + 4 bytes per head, keys after their means): each op
// gets its head's metadata.
TEST_F(DeviceSinkTest, KlCodecsReproduceTheHostRestore) {
  CheckpointOptions opts;
  SetCodec(opts, ParseKvCodecSpec("k:kl:3/v:kl:2.5").value());
  opts.token_block = 32;
  opts.key_mean_block = 16;
  ASSERT_TRUE(Checkpoint(session_->cache(), opts, store_, "kl").ok());
  ASSERT_TRUE(RunOnFake("kl").ok());
  EXPECT_EQ(plan_.meta_at[1], 2u * 2 * (5 * 64 + 4));  // layer 0: two K, two V metadata
  auto host = Restore(store_, "kl", RestoreOptions{});
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  for (uint32_t l = 0; l < 3; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto& got = device_->tensor(l, kv);
      ASSERT_EQ(std::memcmp(got.data(), (*host)->cache().tensor(l, kv), got.size()), 0)
          << "layer " << l << " kv " << kv;
    }
  }
}

// Payloads 64-aligned (format version 9): several chunks share a slot's 4 KiB extent, the payload
// inside it. Every op must read its payload where it sits in the slot (the fake's device slot is
// filled with 0xEE outside what Upload copied), and a neighbour's bytes in the extent are ignored.
TEST_F(DeviceSinkTest, PayloadsInsideTheirExtentReproduceTheHostRestore) {
  for (const char* spec : {"tq2.5", "k:kl:3/v:tq3"}) {
    SCOPED_TRACE(spec);
    CheckpointOptions opts;
    SetCodec(opts, ParseKvCodecSpec(spec).value());
    opts.layer_overrides.push_back(ParseLayerCodec("1:fp16").value());
    opts.token_block = 16;
    opts.exact_head = 2;
    opts.exact_tail = 3;
    opts.key_mean_block = 16;
    opts.alignment = 64;
    ASSERT_TRUE(Checkpoint(session_->cache(), opts, store_, "a64").ok());
    ASSERT_TRUE(RunOnFake("a64").ok());
    size_t inside = 0;
    for (size_t i = 0; i < reader_->chunks().size(); ++i) {
      inside += reader_->PayloadOffsetInExtent(i) > 0;
    }
    EXPECT_GT(inside, 3u);
    EXPECT_EQ(device_->uploads, static_cast<int>(reader_->chunks().size()));
    auto host = Restore(store_, "a64", RestoreOptions{});
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    for (uint32_t l = 0; l < 3; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const auto& got = device_->tensor(l, kv);
        ASSERT_EQ(std::memcmp(got.data(), (*host)->cache().tensor(l, kv), got.size()), 0)
            << "layer " << l << " kv " << kv;
      }
    }
  }
}

// Group metadata the codec refuses, in a container whose checksums are right (re-sealed): the
// host refuses the chunk before it reaches the device, whose kernels trust their inputs; named as
// the host restore names it.
TEST_F(DeviceSinkTest, GroupMetadataTheCodecRefusesIsRefusedBeforeTheDevice) {
  for (const char* spec : {"kl:2.5", "tq2.5"}) {
    SCOPED_TRACE(spec);
    CheckpointOptions opts;
    opts.codec = ParseCodecSpec(spec).value();
    opts.token_block = 32;
    ASSERT_TRUE(Checkpoint(session_->cache(), opts, store_, "ok").ok());
    auto obj = store_.Open("ok");
    ASSERT_TRUE(obj.ok());
    auto reader = ContainerReader::Open(obj->get(), "ok");
    ASSERT_TRUE(reader.ok());
    auto w = store_.Create("bad");
    ASSERT_TRUE(w.ok());
    auto writer = ContainerWriter::Create(w->get(), (*reader)->header());
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    int bad_chunk = -1;
    for (const ChunkEntry& e : (*reader)->chunks()) {
      std::vector<uint8_t> payload(e.size);
      ASSERT_TRUE((*obj)->ReadAt(e.offset, payload).ok());
      // Layer 1's V head 1 (the 4th of 4 equal metadata): kl's first channel a bit more or
      // less, tq2.5's mask an outlier more or less.
      if (e.type == ChunkType::kGroupMeta && e.layer == 1) {
        payload[payload.size() / 4 * 3] ^= 0x01;
        bad_chunk = static_cast<int>(&e - (*reader)->chunks().data());
      }
      ASSERT_TRUE((*writer)->AddChunk(e, payload).ok());
    }
    ASSERT_GT(bad_chunk, 0);
    ASSERT_TRUE((*writer)->Finish().ok());
    ASSERT_TRUE((*w)->Commit().ok());
    const Status s = RunOnFake("bad");
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find("layer 1 V head 1"), std::string::npos) << s.ToString();
    EXPECT_EQ(device_->runs, bad_chunk) << "the chunks before it only";
    EXPECT_EQ(device_->uploads, bad_chunk);
    EXPECT_EQ(device_->unrun_retires, 1);
    auto host = Restore(store_, "bad", RestoreOptions{});
    ASSERT_FALSE(host.ok());
    EXPECT_TRUE(host.status().IsCorruption());
    EXPECT_NE(host.status().message().find(s.message()), std::string::npos)
        << host.status().ToString() << " vs " << s.ToString();
  }
}

TEST_F(DeviceSinkTest, CorruptPaddingIsRefusedBeforeAnythingReachesTheDevice) {
  auto bad = file_;
  bad[PaddingAfter(0)] = 1;
  Put("pad", bad);
  Status s = RunOnFake("pad");
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("padding after chunk 0"), std::string::npos) << s.ToString();
  EXPECT_EQ(device_->uploads, 0);
  EXPECT_EQ(device_->runs, 0);
}

TEST_F(DeviceSinkTest, BadChecksumIsRefusedBeforeAnythingReachesTheDevice) {
  auto obj = store_.Open("s");
  auto r = ContainerReader::Open(obj->get(), "s");
  auto bad = file_;
  bad[(*r)->chunks()[0].offset] ^= 0x40;
  Put("sum", bad);
  Status s = RunOnFake("sum");
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("chunk 0"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
  EXPECT_EQ(device_->uploads, 0);
}

TEST_F(DeviceSinkTest, ALaterBadChunkStopsTheDeviceBeforeIt) {
  const size_t k = 4;
  auto bad = file_;
  bad[PaddingAfter(k)] = 0x80;
  Put("late", bad);
  Status s = RunOnFake("late");
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_LE(device_->uploads, static_cast<int>(k));  // chunks 0..k-1 at most
}

TEST_F(DeviceSinkTest, PlanPlacesMetadataAndExactRows) {
  ASSERT_TRUE(RunOnFake("s").ok());
  const ContainerHeader& h = reader_->header();
  ASSERT_EQ(plan_.codecs.size(), h.codecs.size() + 1);
  EXPECT_EQ(plan_.codecs.back().kind, CodecKind::kRaw);
  const uint64_t meta = GroupMetaBytesOf(h.codecs[h.layer_codec[0]]);
  ASSERT_GT(meta, 0u);
  EXPECT_EQ(plan_.meta_at[0], 0u);
  EXPECT_EQ(plan_.meta_at[1], 2 * 2 * meta);
  EXPECT_EQ(plan_.meta_at[2], plan_.meta_at[1]);  // layer 1 is fp16: no metadata
  for (size_t i = 0; i < reader_->chunks().size(); ++i) {
    const ChunkEntry& e = reader_->chunks()[i];
    if (e.type != ChunkType::kExactRows) continue;
    std::vector<DeviceOp> ops;
    ASSERT_TRUE(PlanDeviceOps(h, plan_, e, "s", &ops).ok());
    ASSERT_EQ(ops.size(), 4u);  // K head, K tail, V head, V tail
    EXPECT_EQ(ops[1].token_begin, 70u - 3u);
    EXPECT_EQ(ops[3].src_offset + 2 * 3 * 64 * 2, e.size);  // ranges tile the chunk
  }
  ChunkEntry wrong = reader_->chunks()[0];
  ASSERT_EQ(wrong.type, ChunkType::kGroupMeta);
  wrong.size += 1;
  std::vector<DeviceOp> ops;
  EXPECT_TRUE(PlanDeviceOps(h, plan_, wrong, "s", &ops).IsCorruption());
}

TEST_F(DeviceSinkTest, PlanPlacesKeyMeansOfTurboQuantLayers) {
  ASSERT_TRUE(RunOnFake("s").ok());
  const ContainerHeader& h = reader_->header();
  ASSERT_EQ(h.key_mean_block, 16u);
  // (blocks x head_dim + tokens) x heads x f16: means and coefficients
  const uint64_t layer_bytes = (5 * 64 + 70) * 2 * 2;
  EXPECT_EQ(plan_.means_at[0], 0u);
  EXPECT_EQ(plan_.means_at[1], DevicePlan::kNoMeans);  // fp16 layer: keys stored as they are
  EXPECT_EQ(plan_.means_at[2], layer_bytes);
  EXPECT_EQ(plan_.means_total, 2 * layer_bytes);
  // Two TurboQuant layers x 3 K chunks x 2 heads decoded with their means.
  EXPECT_EQ(device_->centered_ops, 2 * 3 * 2);
  EXPECT_EQ(device_->means_stored, 2);
  for (const ChunkEntry& e : reader_->chunks()) {
    if (e.type != ChunkType::kKeyMeans) continue;
    ChunkEntry wrong = e;
    wrong.size -= 4;
    std::vector<DeviceOp> ops;
    EXPECT_TRUE(PlanDeviceOps(h, plan_, wrong, "s", &ops).IsCorruption());
    wrong = e;
    wrong.layer = 1;
    EXPECT_TRUE(PlanDeviceOps(h, plan_, wrong, "s", &ops).IsCorruption());
  }
}

}  // namespace
}  // namespace tqkv
