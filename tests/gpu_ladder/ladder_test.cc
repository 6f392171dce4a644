// CPU side of the GPU I/O ladder: the probe without a device, cuFile load failures, the O_DIRECT
// probe, RestoreToGpu's refusal without a device, and the pinned-host rung's host part (padded
// chunk reads into aligned slots + verification through every io mode) feeding a host emulation of
// the decode kernels, checked against the CPU restore byte for byte (canonical and paged).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <vector>

#include "checkpoint/gpu/device_destination.h"
#include "cuda/packed.h"
#include "cuda/params.h"
#include "store/store_test_util.h"
#include "tqkv/aligned_buffer.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/container.h"
#include "tqkv/gpu.h"
#include "tqkv/kv_layout.h"
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
  // The store's host I/O for each rung (no device needed).
  EXPECT_EQ(*GpuStoreIo("gds"), IoMode::kDirect);
  EXPECT_EQ(*GpuStoreIo("direct"), IoMode::kDirect);
  EXPECT_EQ(*GpuStoreIo("uring"), IoMode::kUring);
  EXPECT_EQ(*GpuStoreIo("buffered"), IoMode::kBuffered);
  EXPECT_EQ(GpuStoreIo("nvme").status().code(), StatusCode::kInvalidArgument);
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

// Host tensors standing in for a caller's device tensors: one buffer per (layer, kv) of
// `elems` elements filled with 0xAB, viewed through `layout`.
struct HostDestination {
  std::vector<std::vector<uint8_t>> bufs;  // [layer * 2 + kv]
  LayoutTensors t;
  HostDestination(const ModelGeometry& g, uint64_t tokens, DType dtype, KvLayout layout,
                  uint64_t elems) {
    bufs.assign(2 * g.layers, std::vector<uint8_t>(elems * DTypeSize(dtype), 0xAB));
    t.geometry = g;
    t.dtype = dtype;
    t.tokens = tokens;
    t.layout = std::move(layout);
    t.tensor_elems = elems;
    for (uint32_t l = 0; l < g.layers; ++l) {
      t.k.push_back(bufs[2 * l].data());
      t.v.push_back(bufs[2 * l + 1].data());
    }
  }
  const std::vector<uint8_t>& tensor(uint32_t layer, int kv) const { return bufs[2 * layer + kv]; }
};

// The host half of the pinned rung, as gpu_restore.cc does it: the destination checked by
// CheckDeviceDestination and addressed through DeviceDst (what the kernels get), every chunk's
// 4 KiB-padded extent read with ReadBatch into aligned slots (standing in for cudaHostAlloc
// memory), verified, then "copied" and decoded by the host emulation of the kernels.
Status EmulatedGpuRestore(Store& store, const std::string& key, const LayoutTensors& out) {
  TQKV_ASSIGN_OR_RETURN(auto object, store.Open(key));
  TQKV_ASSIGN_OR_RETURN(auto reader, ContainerReader::Open(object.get(), key));
  const ContainerHeader& h = reader->header();
  const ModelGeometry& g = h.geometry;
  TQKV_RETURN_IF_ERROR(gpu::CheckDeviceDestination(out, h, key));
  std::vector<cuda::PackedCodec> packed;
  for (const auto& cp : h.codecs) {
    TQKV_ASSIGN_OR_RETURN(auto pc, cuda::PackCodecParams(cp));
    packed.push_back(std::move(pc));
  }
  const size_t es = DTypeSize(out.dtype);
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
        const uint64_t blocks = KeyMeanBlocks(h, e.layer);
        means = {means_chunk.data(),
                 means_chunk.data() + blocks * g.token_elems() * DTypeSize(h.key_mean_dtype),
                 cuda::ToGpuDType(h.key_mean_dtype), h.key_mean_block, blocks, h.tokens};
      }
      const cuda::GpuDst dst = gpu::DeviceDst(out, e.layer, e.kv, out.layout.block_ids.data());
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

  // Canonical: the CPU restore's tensors byte for byte.
  HostDestination canon(g, tokens, DType::kF16, KvLayout::Canonical(g), tokens * g.token_elems());
  Status s = EmulatedGpuRestore(**store, "sess", canon.t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const size_t tbytes = tokens * g.token_elems() * 2;
  for (uint32_t l = 0; l < g.layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      ASSERT_EQ(0, std::memcmp(canon.tensor(l, kv).data(), (*cpu)->cache().tensor(l, kv), tbytes))
          << "layer " << l << " kv " << kv;
    }
  }
  // vLLM's paged layout, 9 blocks of 16 tokens in a scrambled table of a 13-block pool, and a
  // strided paged layout with head-major blocks and padding between heads: the same bytes as
  // the host restore into the same layout, untouched elements (unused blocks, padding) included.
  const uint64_t bs = 16;
  const std::vector<int64_t> table = {11, 3, 0, 8, 5, 9, 1, 12, 4};
  KvLayout vllm;
  vllm.token_stride = static_cast<int64_t>(g.token_elems());
  vllm.head_stride = g.head_dim;
  vllm.block_tokens = bs;
  vllm.block_stride = static_cast<int64_t>(bs * g.token_elems());
  vllm.block_ids = table;
  KvLayout head_major = vllm;  // [block][head][token][head_dim + 8]
  head_major.token_stride = g.head_dim + 8;
  head_major.head_stride = static_cast<int64_t>(bs * (g.head_dim + 8));
  head_major.block_stride = head_major.head_stride * g.kv_heads;
  for (const KvLayout& layout : {vllm, head_major}) {
    const uint64_t elems = 13 * static_cast<uint64_t>(layout.block_stride);
    HostDestination want(g, tokens, DType::kF16, layout, elems);
    RestoreOptions hro;
    ASSERT_TRUE(RestoreInto(**store, "sess", want.t, hro).ok());
    HostDestination got(g, tokens, DType::kF16, layout, elems);
    s = EmulatedGpuRestore(**store, "sess", got.t);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        ASSERT_EQ(got.tensor(l, kv), want.tensor(l, kv))
            << "layer " << l << " kv " << kv << " token_stride " << layout.token_stride;
      }
    }
  }
}

// What the kernels address (DeviceDst -> DstElementOffset) is where KvLayout says the element is,
// for canonical, transposed, padded and paged layouts.
TEST(DeviceDestination, KernelAddressingEqualsKvLayout) {
  const ModelGeometry g{1, 3, 8};
  const uint64_t tokens = 37;
  std::vector<KvLayout> layouts;
  layouts.push_back(KvLayout::Canonical(g));
  KvLayout t;  // [heads][tokens][head_dim], as transformers keeps it
  t.token_stride = g.head_dim;
  t.head_stride = static_cast<int64_t>(tokens * g.head_dim);
  layouts.push_back(t);
  KvLayout p;  // paged, head-major blocks with 3 elements of padding per row
  p.token_stride = g.head_dim + 3;
  p.head_stride = 16 * p.token_stride;
  p.block_stride = p.head_stride * g.kv_heads;
  p.block_tokens = 16;
  p.block_ids = {4, 0, 2};
  layouts.push_back(p);
  for (const KvLayout& l : layouts) {
    LayoutTensors lt;
    lt.geometry = g;
    lt.tokens = tokens;
    lt.layout = l;
    lt.k = {nullptr};
    lt.v = {nullptr};
    const cuda::GpuDst d = gpu::DeviceDst(lt, 0, 1, l.block_ids.data());
    for (uint64_t tok = 0; tok < tokens; ++tok) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t c = 0; c < g.head_dim; ++c) {
          ASSERT_EQ(cuda::DstElementOffset(d, tok, h, c), static_cast<uint64_t>(l.Offset(tok, h) + c))
              << "token " << tok << " head " << h << " block_tokens " << l.block_tokens;
        }
      }
    }
  }
}

// A destination that does not match the session, or that the kernels cannot address, is refused
// by the host before a byte is read or written.
TEST(DeviceDestination, MismatchesAreRefusedBeforeAnythingIsWritten) {
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  auto store = OpenStore(dir.path());
  ASSERT_TRUE(store.ok());
  const ModelGeometry g{2, 2, 64};
  Checkpoint(**store, "s", "tq3", 100, g);
  struct Case {
    const char* name;
    std::function<void(LayoutTensors&)> spoil;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"tokens", [](LayoutTensors& t) { t.tokens = 99; }, "holds 100 tokens"},
      {"geometry", [](LayoutTensors& t) { t.geometry.kv_heads = 1; }, "expected 2 layers x 1 KV"},
      {"dtype", [](LayoutTensors& t) { t.dtype = static_cast<DType>(9); }, "f16, bf16 or f32"},
      {"channels", [](LayoutTensors& t) { t.layout.dim_stride = 2; }, "contiguous"},
      {"bounds", [](LayoutTensors& t) { t.tensor_elems -= 1; }, "restore s"},
      {"tensors", [](LayoutTensors& t) { t.v.pop_back(); }, "2 layers but 2 K and 1 V"},
  };
  for (const Case& c : cases) {
    HostDestination d(g, 100, DType::kF16, KvLayout::Canonical(g), 100 * g.token_elems());
    c.spoil(d.t);
    const Status s = EmulatedGpuRestore(**store, "s", d.t);
    ASSERT_FALSE(s.ok()) << c.name;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.name << ": " << s.message();
    for (const auto& b : d.bufs) {
      ASSERT_TRUE(std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0xAB; })) << c.name;
    }
  }
  // Without a device the restore itself says so, whatever the destination.
  if (!HaveDevice()) {
    HostDestination d(g, 100, DType::kF16, KvLayout::Canonical(g), 100 * g.token_elems());
    auto r = RestoreIntoGpu(**store, "s", d.t, GpuRestoreOptions{});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDeviceError);
  }
}

INSTANTIATE_TEST_SUITE_P(
    IoModes, PinnedRungTest,
    ::testing::Values(RungCase{"buffered", "tq3"}, RungCase{"direct", "tq3"},
                      RungCase{"uring", "tq3"}, RungCase{"direct", "tq2.5,norm=f16"},
                      RungCase{"uring", "tq3.5,nc=1"}, RungCase{"buffered", "fp16"},
                      RungCase{"direct", "tq:b=4,rot=haar"}, RungCase{"uring", "k4v2"},
                      RungCase{"direct", "k:tq2.5/v:tq3,norm=f16"},
                      RungCase{"buffered", "k:tq3/v:tq3.5"}, RungCase{"direct", "kl:2.5"},
                      RungCase{"uring", "k:kl:3/v:kl:2.4,norm=f32"}),
    [](const ::testing::TestParamInfo<RungCase>& info) {
      std::string s = info.param.io + "_" + info.param.codec;
      for (char& ch : s) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return s;
    });

}  // namespace
}  // namespace tqkv
