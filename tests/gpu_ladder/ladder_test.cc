// CPU side of the GPU I/O ladder: the probe without a device, cuFile load failures, the O_DIRECT
// probe, RestoreToGpu's refusal without a device, and the pinned-host rung's host part (padded
// chunk reads into aligned slots + verification through every io mode) feeding a host emulation of
// the decode kernels, checked against the CPU restore byte for byte (canonical and paged).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

#include "cuda/layout.h"
#include "cuda/params.h"
#include "store/store_test_util.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/container.h"
#include "tqkv/gpu.h"
#include "tqkv/synthetic_source.h"

namespace tqkv {
namespace {

bool HaveDevice() { return CudaDeviceCount().ok(); }

TEST(GpuLadder, ProbeWithoutDeviceChoosesNoGpuPathAndSaysWhy) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present: this test covers the no-device case";
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  GpuProbeOptions o;
  o.dir = dir.path();
  const GpuProbe p = ProbeGpuLadder(o);
  EXPECT_EQ(p.device_count, 0);
  EXPECT_FALSE(p.chosen.has_value());
  EXPECT_EQ(p.device_error.rfind("no CUDA device", 0), 0u) << p.device_error;
  ASSERT_EQ(p.rungs.size(), 3u);
  EXPECT_EQ(p.rungs[0].path, GpuIoPath::kGds);
  EXPECT_EQ(p.rungs[1].path, GpuIoPath::kDirect);
  EXPECT_EQ(p.rungs[2].path, GpuIoPath::kBuffered);
  for (const GpuRung& r : p.rungs) {
    EXPECT_FALSE(r.usable);
    EXPECT_NE(r.reason.find("no CUDA device"), std::string::npos) << r.reason;
  }
  EXPECT_FALSE(p.cufile_driver_ok);
  const std::string json = p.ToJson();
  EXPECT_NE(json.find("\"chosen\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("no CUDA device"), std::string::npos);
}

TEST(GpuLadder, CuFileThatDoesNotLoadIsReportedNotFatal) {
  GpuProbeOptions o;
  o.cufile_libraries = {"libtqkv-no-such-cufile.so.0"};
  const GpuProbe p = ProbeGpuLadder(o);
  EXPECT_FALSE(p.cufile_loaded);
  EXPECT_NE(p.cufile_error.find("libtqkv-no-such-cufile.so.0"), std::string::npos) << p.cufile_error;
  EXPECT_FALSE(p.rungs[0].usable);
  // With a device, gds's reason is the load failure; the other rungs do not depend on cuFile.
  if (p.device_count > 0) {
    EXPECT_NE(p.rungs[0].reason.find("cuFile"), std::string::npos);
  }
}

TEST(GpuLadder, LibraryWithoutCuFileSymbolsIsRefused) {
  GpuProbeOptions o;
  o.cufile_libraries = {"libc.so.6"};  // loads, but has no cuFile entry points
  const GpuProbe p = ProbeGpuLadder(o);
  EXPECT_FALSE(p.cufile_loaded);
  EXPECT_NE(p.cufile_error.find("missing symbols cuFileDriverOpen"), std::string::npos)
      << p.cufile_error;
}

TEST(GpuLadder, ODirectProbe) {
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  GpuProbeOptions o;
  o.dir = dir.path();
  GpuProbe p = ProbeGpuLadder(o);
  // ScratchDir avoids tmpfs, so O_DIRECT works there on this project's machines.
  EXPECT_TRUE(p.o_direct_ok) << p.o_direct_error;
  EXPECT_TRUE(dir.Files().empty()) << "the probe file must be removed";
  o.dir = dir.path() + "/missing/sub";
  p = ProbeGpuLadder(o);
  EXPECT_FALSE(p.o_direct_ok);
  EXPECT_NE(p.o_direct_error.find("open(O_DIRECT)"), std::string::npos) << p.o_direct_error;
  EXPECT_FALSE(p.rungs[1].usable);
  o.dir.clear();
  p = ProbeGpuLadder(o);
  EXPECT_FALSE(p.o_direct_ok);
  EXPECT_NE(p.o_direct_error.find("not tested"), std::string::npos);
}

TEST(GpuLadder, ParseIoPath) {
  EXPECT_EQ(*ParseGpuIoPath("gds"), GpuIoPath::kGds);
  EXPECT_EQ(*ParseGpuIoPath("direct"), GpuIoPath::kDirect);
  EXPECT_EQ(*ParseGpuIoPath("uring"), GpuIoPath::kDirect);
  EXPECT_EQ(*ParseGpuIoPath("buffered"), GpuIoPath::kBuffered);
  EXPECT_FALSE(ParseGpuIoPath("nvme").ok());
  EXPECT_EQ(GpuIoPathName(GpuIoPath::kDirect), "direct");
}

// A small synthetic session checkpointed under `key`.
void Checkpoint(Store& store, const std::string& key, const std::string& codec, uint64_t tokens,
                ModelGeometry g) {
  CheckpointOptions opts;
  SetCodec(opts, *ParseKvCodecSpec(codec));
  opts.token_block = 48;  // several chunks per tensor, a short last one
  auto src = MakeSyntheticSource("test", g, DType::kF16, tokens, 5);
  auto st = tqkv::Checkpoint(*src, opts, store, key);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
}

TEST(GpuLadder, RestoreToGpuWithoutDeviceIsDeviceErrorNotCrash) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  testing_util::ScratchDir dir;
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store.ok());
  Checkpoint(**store, "s", "tq3", 100, {2, 2, 64});
  GpuRestoreOptions o;
  auto r = RestoreToGpu(**store, "s", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeviceError);
  EXPECT_NE(r.status().message().find("no CUDA device"), std::string::npos);
  o.io = GpuIoPath::kGds;
  r = RestoreToGpu(**store, "s", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeviceError);
}

// The host half of the pinned rung, as gpu_restore.cc does it: every chunk's 4 KiB-padded extent
// read with ReadBatch into aligned slots (standing in for cudaHostAlloc memory), verified, then
// "copied" and decoded by the host emulation of the kernels into a canonical or paged layout.
struct HostGpuRestore {
  std::vector<std::vector<uint8_t>> tensors;  // [layer * 2 + kv]
};

Status EmulatedGpuRestore(Store& store, const std::string& key, DType dtype, uint32_t block_size,
                          const std::vector<int32_t>& block_ids, HostGpuRestore* out) {
  TQKV_ASSIGN_OR_RETURN(auto object, store.Open(key));
  TQKV_ASSIGN_OR_RETURN(auto reader, ContainerReader::Open(object.get(), key));
  const ContainerHeader& h = reader->header();
  const ModelGeometry& g = h.geometry;
  std::vector<cuda::PackedCodec> packed;
  for (const auto& cp : h.codecs) {
    TQKV_ASSIGN_OR_RETURN(auto pc, cuda::PackCodecParams(cp));
    packed.push_back(std::move(pc));
  }
  uint64_t rows = h.tokens;
  if (block_size) rows = (*std::max_element(block_ids.begin(), block_ids.end()) + 1ull) * block_size;
  const size_t es = DTypeSize(dtype);
  out->tensors.assign(2 * g.layers, std::vector<uint8_t>(rows * g.token_elems() * es, 0));
  const auto& chunks = reader->chunks();
  const size_t slots = 3;
  uint64_t max_chunk = kContainerAlignment;
  for (const auto& e : chunks) max_chunk = std::max(max_chunk, AlignUp(e.size, kContainerAlignment));
  std::vector<AlignedBuffer> bufs(slots);
  for (auto& b : bufs) b.Reserve(max_chunk);
  std::vector<uint8_t> metas, means_chunk;
  uint32_t means_layer = UINT32_MAX;
  for (size_t first = 0; first < chunks.size(); first += slots) {
    const size_t n = std::min(slots, chunks.size() - first);
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < n; ++i) {
      const ChunkEntry& e = chunks[first + i];
      const uint64_t len = std::min<uint64_t>(AlignUp(e.size, kContainerAlignment), reader->file_bytes() - e.offset);
      if (reinterpret_cast<uintptr_t>(bufs[i].data()) % kContainerAlignment != 0) {
        return Status::Internal("slot not aligned for O_DIRECT");
      }
      reqs.push_back(ReadRequest{e.offset, {bufs[i].data(), static_cast<size_t>(len)}});
    }
    TQKV_RETURN_IF_ERROR(object->ReadBatch(reqs));
    for (size_t i = 0; i < n; ++i) {
      const ChunkEntry& e = chunks[first + i];
      const uint8_t* data = bufs[i].data();
      TQKV_RETURN_IF_ERROR(reader->VerifyChunk(e, {data, static_cast<size_t>(e.size)}));
      const cuda::GpuCodecParams& p = packed[LayerCodecIndex(h, e.layer, e.kv)].params;
      // [K heads][K meta] then [V heads][V meta] (docs/format.md §5).
      const size_t meta_base =
          e.kv == 0 ? 0 : g.kv_heads * packed[LayerCodecIndex(h, e.layer, 0)].params.meta_bytes;
      if (e.type == ChunkType::kGroupMeta) {
        metas.assign(data, data + e.size);
        continue;
      }
      if (e.type == ChunkType::kKeyMeans) {  // before the layer's codes; the K codes add α·μ
        means_chunk.assign(data, data + e.size);
        means_layer = e.layer;
        continue;
      }
      cuda::GpuKeyMeans means{};
      if (e.kv == 0 && means_layer == e.layer) {
        const uint64_t blocks = KeyMeanBlocks(h);
        means = {means_chunk.data(),
                 means_chunk.data() + blocks * g.token_elems() * DTypeSize(h.key_mean_dtype),
                 cuda::ToGpuDType(h.key_mean_dtype), h.key_mean_block, blocks, h.tokens};
      }
      cuda::GpuDst dst{};
      dst.base = out->tensors[2 * e.layer + e.kv].data();
      dst.block_ids = block_ids.data();
      dst.paged = block_size ? 1 : 0;
      dst.block_size = block_size;
      dst.kv_heads = g.kv_heads;
      dst.head_dim = g.head_dim;
      dst.dtype = cuda::ToGpuDType(dtype);
      std::vector<uint8_t> vec(g.head_dim * es);
      for (uint32_t head = 0; head < g.kv_heads; ++head) {
        const uint8_t* mask =
            p.meta_bytes ? metas.data() + meta_base + head * p.meta_bytes : nullptr;
        for (uint64_t t = 0; t < e.token_count; ++t) {
          const uint8_t* code = data + (head * e.token_count + t) * p.code_bytes;  // head-major
          if (p.kind == cuda::kGpuRaw) {
            for (uint32_t c = 0; c < g.head_dim; ++c) {
              cuda::StoreElement(vec.data(), dst.dtype, c, cuda::LoadElement(code, p.raw_dtype, c));
            }
          } else {
            const uint64_t tok = e.token_begin + t;
            cuda::EmulateDecodeVector(
                p, code, mask, vec.data(), dst.dtype,
                means.means ? cuda::KeyMeanRow(means, tok, head, g.head_dim) : nullptr,
                means.dtype, means.means ? cuda::KeyMeanAlpha(means, tok, head) : 0.0f);
          }
          for (uint32_t c = 0; c < g.head_dim; ++c) {
            std::memcpy(static_cast<uint8_t*>(dst.base) +
                            cuda::DstElementOffset(dst, e.token_begin + t, head, c) * es,
                        vec.data() + c * es, es);
          }
        }
      }
    }
  }
  return Status::Ok();
}

struct RungCase {
  std::string io;
  std::string codec;
};

class PinnedRungTest : public ::testing::TestWithParam<RungCase> {};

TEST_P(PinnedRungTest, HostPartThroughEveryIoModeMatchesCpuRestore) {
  const RungCase c = GetParam();
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  auto store = OpenStore("file://" + dir.path() + "?io=" + c.io);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const ModelGeometry g{3, 2, 128};
  const uint64_t tokens = 130;
  Checkpoint(**store, "sess", c.codec, tokens, g);
  RestoreOptions ro;
  ro.dtype = DType::kF16;
  auto cpu = Restore(**store, "sess", ro);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();

  HostGpuRestore canon;
  Status s = EmulatedGpuRestore(**store, "sess", DType::kF16, 0, {}, &canon);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const size_t tbytes = tokens * g.token_elems() * 2;
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      ASSERT_EQ(0, std::memcmp(canon.tensors[2 * l + kv].data(), (*cpu)->cache().tensor(l, kv), tbytes))
          << "layer " << l << " kv " << kv;
    }
  }
  // Paged: 9 blocks of 16 tokens in a scrambled table; each token's row lands in its block.
  const uint32_t bs = 16;
  std::vector<int32_t> table = {11, 3, 0, 8, 5, 9, 1, 12, 4};
  HostGpuRestore paged;
  s = EmulatedGpuRestore(**store, "sess", DType::kF16, bs, table, &paged);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const size_t row = g.token_elems() * 2;
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto* want = static_cast<const uint8_t*>((*cpu)->cache().tensor(l, kv));
      for (uint64_t t = 0; t < tokens; ++t) {
        const uint64_t prow = static_cast<uint64_t>(table[t / bs]) * bs + t % bs;
        ASSERT_EQ(0, std::memcmp(paged.tensors[2 * l + kv].data() + prow * row, want + t * row, row))
            << "layer " << l << " token " << t;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    IoModes, PinnedRungTest,
    ::testing::Values(RungCase{"buffered", "tq3"}, RungCase{"direct", "tq3"},
                      RungCase{"uring", "tq3"}, RungCase{"direct", "tq2.5,norm=f16"},
                      RungCase{"uring", "tq3.5,nc=1"}, RungCase{"buffered", "fp16"},
                      RungCase{"direct", "tq:b=4,rot=haar"}, RungCase{"uring", "k4v2"},
                      RungCase{"direct", "k:tq2.5/v:tq3,norm=f16"},
                      RungCase{"buffered", "k:tq3/v:tq3.5"}),
    [](const ::testing::TestParamInfo<RungCase>& info) {
      std::string s = info.param.io + "_" + info.param.codec;
      for (char& ch : s) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return s;
    });

}  // namespace
}  // namespace tqkv
