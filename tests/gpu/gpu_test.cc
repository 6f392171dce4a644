// Device tests (label gpu): GPU codes and decoded values against the CPU codec, paged placement,
// and RestoreToGpu end to end with per-layer events, with and without exact rows. Each test skips
// with "no CUDA device: ..." where cudaGetDeviceCount fails or finds none (CI, the dev VM).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/params.h"
#include "gpu_ladder/gpu_test_util.h"
#include "store/store_test_util.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/codec.h"
#include "tqkv/gpu.h"
#include "tqkv/kv_layout.h"
#include "tqkv/synthetic_source.h"

namespace tqkv {
namespace {

#define SKIP_WITHOUT_DEVICE()                                   \
  do {                                                          \
    auto n_ = CudaDeviceCount();                                \
    if (!n_.ok()) GTEST_SKIP() << n_.status().message();        \
  } while (0)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

template <typename T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) { cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)); }
  ~Dev() { cudaFree(p); }
};

struct Case {
  std::string spec;
  uint32_t head_dim;
};
std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const auto& s : gpu_test::KernelSpecs()) {
    for (uint32_t d : gpu_test::KernelHeadDims()) out.push_back({s, d});
  }
  out.push_back({"tq3", 96});
  out.push_back({"tq2.5", 48});
  // kl: decoded on the GPU, encoded on the CPU (LaunchEncode refuses it).
  for (uint32_t d : gpu_test::KernelHeadDims()) out.push_back({"kl:2.5", d});
  out.push_back({"kl:2.4", 128});
  out.push_back({"kl:4,norm=f32", 128});
  out.push_back({"kl:3", 80});
  return out;
}

class GpuCodecTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuCodecTest, CodesBitIdenticalAndDecodeMatches) {
  SKIP_WITHOUT_DEVICE();
  const Case c = GetParam();
  auto codec = Codec::Create(*ParseCodecSpec(c.spec), c.head_dim);
  ASSERT_TRUE(codec.ok()) << codec.status().ToString();
  auto packed = cuda::PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  cuda::GpuCodecParams p = packed->params;
  const uint32_t heads = 3, tokens = 700, d = c.head_dim;
  const size_t cb = p.code_bytes, mb = p.meta_bytes;
  // x: [token][head][d] f16.
  const std::vector<uint16_t> x = gpu_test::ToHalf(
      gpu_test::TestVectorsFor((*codec)->params().norm_dtype, size_t{tokens} * heads, d, d));
  std::vector<uint8_t> meta(heads * mb);
  for (uint32_t h = 0; h < heads; ++h) {
    ASSERT_TRUE((*codec)->SelectGroupMeta(x.data() + h * d, DType::kF16, tokens, heads * d,
                                          {meta.data() + h * mb, mb}).ok());
  }
  // CPU codes, head-major like a codes chunk.
  std::vector<uint8_t> cpu(size_t{heads} * tokens * cb);
  for (uint32_t h = 0; h < heads; ++h) {
    ASSERT_TRUE((*codec)->Encode(x.data() + h * d, DType::kF16, tokens, heads * d,
                                 {meta.data() + h * mb, mb}, {cpu.data() + h * tokens * cb, tokens * cb}).ok());
  }
  Dev<float> table(packed->table.size());
  Dev<uint16_t> dx(x.size());
  Dev<uint8_t> dmeta(meta.size()), dcodes(cpu.size());
  Dev<uint16_t> dout(x.size());
  ASSERT_CUDA(cudaMemcpy(table.p, packed->table.data(), packed->table.size() * 4, cudaMemcpyHostToDevice));
  p.table = table.p;
  ASSERT_CUDA(cudaMemcpy(dx.p, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(dmeta.p, meta.data(), meta.size(), cudaMemcpyHostToDevice));
  if (p.kind == cuda::kGpuTransform) {
    EXPECT_EQ(cuda::LaunchEncode(p, dx.p, cuda::kGpuF16, dmeta.p, heads, tokens, dcodes.p, nullptr),
              cudaErrorInvalidValue);
  } else {
    ASSERT_CUDA(cuda::LaunchEncode(p, dx.p, cuda::kGpuF16, mb ? dmeta.p : nullptr, heads, tokens, dcodes.p, nullptr));
    std::vector<uint8_t> gpu(cpu.size());
    ASSERT_CUDA(cudaMemcpy(gpu.data(), dcodes.p, gpu.size(), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t v = 0; v < size_t{heads} * tokens; ++v) bad += std::memcmp(&gpu[v * cb], &cpu[v * cb], cb) != 0;
    EXPECT_EQ(bad, 0u) << c.spec << " d=" << d << ": vectors whose GPU codes differ from the CPU's";
  }

  // Decode the CPU codes on the GPU into f16 canonical; compare with the CPU decode.
  ASSERT_CUDA(cudaMemcpy(dcodes.p, cpu.data(), cpu.size(), cudaMemcpyHostToDevice));
  const cuda::GpuDst dst = cuda::CanonicalDst(dout.p, heads, d, cuda::kGpuF16);
  ASSERT_CUDA(cuda::LaunchDecode(p, dcodes.p, mb ? dmeta.p : nullptr, heads, 0, tokens, dst, nullptr));
  std::vector<uint16_t> got(x.size()), want(x.size());
  ASSERT_CUDA(cudaMemcpy(got.data(), dout.p, got.size() * 2, cudaMemcpyDeviceToHost));
  for (uint32_t h = 0; h < heads; ++h) {
    ASSERT_TRUE((*codec)->Decode({cpu.data() + h * tokens * cb, tokens * cb}, tokens, {meta.data() + h * mb, mb},
                                 want.data() + h * d, DType::kF16, heads * d).ok());
  }
  // Documented tolerance: bit-identical (docs/gpu.md); NaN vectors compare as bytes too.
  size_t diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
  EXPECT_EQ(diff, 0u) << c.spec << " d=" << d << ": decoded f16 values differing from the CPU";
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, GpuCodecTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string s = info.param.spec + "_d" + std::to_string(info.param.head_dim);
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s + "_" + std::to_string(info.index);
                         });

TEST(GpuDecode, PagedPlacement) {
  SKIP_WITHOUT_DEVICE();
  auto codec = Codec::Create(*ParseCodecSpec("tq3"), 128);
  ASSERT_TRUE(codec.ok());
  auto packed = cuda::PackCodecParams((*codec)->params());
  ASSERT_TRUE(packed.ok());
  cuda::GpuCodecParams p = packed->params;
  const uint32_t heads = 2, tokens = 40, d = 128, bs = 16, cb = p.code_bytes;
  const std::vector<int64_t> table = {4, 1, 6};
  const auto x = gpu_test::ToHalf(
      gpu_test::TestVectorsFor((*codec)->params().norm_dtype, size_t{tokens} * heads, d, 1));
  std::vector<uint8_t> codes(size_t{heads} * tokens * cb);
  for (uint32_t h = 0; h < heads; ++h) {
    ASSERT_TRUE((*codec)->Encode(x.data() + h * d, DType::kF16, tokens, heads * d, {},
                                 {codes.data() + h * tokens * cb, size_t{tokens} * cb}).ok());
  }
  std::vector<uint16_t> want(x.size());
  for (uint32_t h = 0; h < heads; ++h) {
    ASSERT_TRUE((*codec)->Decode({codes.data() + h * tokens * cb, size_t{tokens} * cb}, tokens, {},
                                 want.data() + h * d, DType::kF16, heads * d).ok());
  }
  const size_t paged_elems = size_t{7} * bs * heads * d;
  Dev<float> dt(packed->table.size());
  Dev<uint8_t> dc(codes.size());
  Dev<int64_t> db(table.size());
  Dev<uint16_t> dout(paged_elems);
  ASSERT_CUDA(cudaMemcpy(dt.p, packed->table.data(), packed->table.size() * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(dc.p, codes.data(), codes.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(db.p, table.data(), table.size() * 8, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(dout.p, 0xFF, paged_elems * 2));
  p.table = dt.p;
  cuda::GpuDst dst = cuda::CanonicalDst(dout.p, heads, d, cuda::kGpuF16);
  dst.block_ids = db.p;
  dst.block_tokens = bs;
  dst.block_stride = int64_t{bs} * heads * d;
  ASSERT_CUDA(cuda::LaunchDecode(p, dc.p, nullptr, heads, 0, tokens, dst, nullptr));
  std::vector<uint16_t> got(paged_elems);
  ASSERT_CUDA(cudaMemcpy(got.data(), dout.p, paged_elems * 2, cudaMemcpyDeviceToHost));
  for (uint32_t t = 0; t < tokens; ++t) {
    const size_t prow = size_t(table[t / bs]) * bs + t % bs;
    ASSERT_EQ(0, std::memcmp(&got[prow * heads * d], &want[size_t{t} * heads * d], heads * d * 2)) << t;
  }
  // Blocks not in the table keep the fill pattern.
  for (int32_t b : {0, 2, 3, 5}) EXPECT_EQ(got[size_t(b) * bs * heads * d], 0xFFFF) << b;
}

class GpuRestoreTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuRestoreTest, EndToEndWithLayerEvents) {
  SKIP_WITHOUT_DEVICE();
  // "IO", "IO+exact" (exact rows: 4 first tokens, 70 last, spanning two chunks), either with
  // "+a64" (payloads 64-aligned, format version 9: each inside its slot's 4 KiB extent).
  std::string param = GetParam();
  const bool a64 = param.ends_with("+a64");
  if (a64) param.resize(param.size() - 4);
  const bool exact = param.ends_with("+exact");
  const std::string io = exact ? param.substr(0, param.size() - 6) : param;
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  auto store = OpenStore("file://" + dir.path() + "?io=" + (io == "buffered" ? "buffered" : "direct"));
  ASSERT_TRUE(store.ok());
  const ModelGeometry g{4, 2, 128};
  CheckpointOptions co;
  co.codec = *ParseCodecSpec("tq3");
  co.layer_overrides.push_back(*ParseLayerCodec("0:tq2.5"));
  co.token_block = 64;
  if (a64) co.alignment = 64;
  if (exact) {
    co.exact_head = 4;
    co.exact_tail = 70;
  }
  auto src = MakeSyntheticSource("test", g, DType::kF16, 300, 3);
  ASSERT_TRUE(Checkpoint(*src, co, **store, "s").ok());
  auto cpu = Restore(**store, "s", RestoreOptions{});
  ASSERT_TRUE(cpu.ok());

  GpuRestoreOptions o;
  auto path = ParseGpuIoPath(io);
  o.io = *path;
  std::vector<uint32_t> layers_seen;
  o.on_layer = [&](uint32_t l, void* ev) {
    EXPECT_NE(ev, nullptr);
    layers_seen.push_back(l);
    return Status::Ok();
  };
  auto r = RestoreToGpu(**store, "s", o);
  if (!r.ok() && io == "gds" && r.status().code() == StatusCode::kUnsupported) {
    GTEST_SKIP() << "gds rung not usable here: " << r.status().message();
  }
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const GpuSession& gs = **r;
  EXPECT_EQ(GpuIoPathName(gs.stats().path), io == "uring" ? "direct" : io);
  EXPECT_EQ(layers_seen, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_GT(gs.stats().first_layer_seconds, 0.0);
  EXPECT_LE(gs.stats().first_layer_seconds, gs.stats().seconds);
  EXPECT_GT(gs.stats().setup_seconds, 0.0);
  EXPECT_LE(gs.stats().setup_seconds, gs.stats().first_layer_seconds);
  // Every chunk is counted, cuFile reads included (they bypass the store's own count).
  auto object = (*store)->Open("s");
  ASSERT_TRUE(object.ok());
  EXPECT_GE(gs.stats().bytes_read, (*object)->Size() * 9 / 10);
  const size_t bytes = 300 * g.token_elems() * 2;
  std::vector<uint8_t> host(bytes);
  for (uint32_t l = 0; l < g.layers; ++l) {
    ASSERT_TRUE(gs.WaitLayer(l).ok());
    EXPECT_EQ(cudaEventQuery(static_cast<cudaEvent_t>(gs.layer_event(l))), cudaSuccess);
    for (int kv = 0; kv < 2; ++kv) {
      ASSERT_CUDA(cudaMemcpy(host.data(), gs.tensor(l, kv), bytes, cudaMemcpyDeviceToHost));
      ASSERT_EQ(0, std::memcmp(host.data(), (*cpu)->cache().tensor(l, kv), bytes)) << l << " " << kv;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(IoPaths, GpuRestoreTest, ::testing::Values("buffered", "direct", "gds", "buffered+exact",
                                                             "gds+exact", "buffered+a64",
                                                             "direct+exact+a64", "gds+exact+a64"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return s;
                         });

// RestoreIntoGpu into a caller's paged device pool (vLLM's layout, a scrambled block table, an
// odd pad between heads) equals the host RestoreInto into the same layout, byte for byte, the
// blocks outside the table untouched; the layer events fire in order.
TEST(GpuRestoreInto, CallerPagedPoolEqualsHostRestoreInto) {
  SKIP_WITHOUT_DEVICE();
  testing_util::ScratchDir dir;
  ASSERT_TRUE(dir.ok());
  auto store = OpenStore("file://" + dir.path());
  ASSERT_TRUE(store.ok());
  const ModelGeometry g{3, 2, 128};
  const uint64_t tokens = 150, bs = 16;
  CheckpointOptions co;
  co.codec = *ParseCodecSpec("tq3");
  co.layer_overrides.push_back(*ParseLayerCodec("1:tq2.5"));
  co.token_block = 64;
  co.exact_tail = 20;
  auto src = MakeSyntheticSource("test", g, DType::kF16, tokens, 9);
  ASSERT_TRUE(Checkpoint(*src, co, **store, "s").ok());
  KvLayout layout;
  layout.head_stride = g.head_dim + 1;  // rows at odd element offsets: the 2-byte store path
  layout.token_stride = layout.head_stride * g.kv_heads;
  layout.block_tokens = bs;
  layout.block_stride = layout.token_stride * static_cast<int64_t>(bs);
  layout.block_ids = {7, 2, 11, 0, 5, 9, 1, 12, 3, 8};  // 10 blocks of a 14-block pool
  const uint64_t elems = 14 * static_cast<uint64_t>(layout.block_stride);
  const size_t bytes = elems * 2;
  std::vector<std::vector<uint8_t>> host(2 * g.layers, std::vector<uint8_t>(bytes, 0x5A));
  std::vector<std::unique_ptr<Dev<uint8_t>>> dev;
  LayoutTensors hd, dd;
  for (LayoutTensors* t : {&hd, &dd}) {
    t->geometry = g;
    t->dtype = DType::kF16;
    t->tokens = tokens;
    t->layout = layout;
    t->tensor_elems = elems;
  }
  for (uint32_t i = 0; i < 2 * g.layers; ++i) {
    dev.push_back(std::make_unique<Dev<uint8_t>>(bytes));
    ASSERT_CUDA(cudaMemset(dev.back()->p, 0x5A, bytes));
    (i % 2 == 0 ? hd.k : hd.v).push_back(host[i].data());
    (i % 2 == 0 ? dd.k : dd.v).push_back(dev.back()->p);
  }
  ASSERT_TRUE(RestoreInto(**store, "s", hd, RestoreOptions{}).ok());
  GpuRestoreOptions o;
  std::vector<uint32_t> seen;
  o.on_layer = [&](uint32_t l, void*) {
    seen.push_back(l);
    return Status::Ok();
  };
  auto r = RestoreIntoGpu(**store, "s", dd, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(r->tokens, tokens);
  std::vector<uint8_t> got(bytes);
  for (uint32_t i = 0; i < 2 * g.layers; ++i) {
    ASSERT_CUDA(cudaMemcpy(got.data(), dev[i]->p, bytes, cudaMemcpyDeviceToHost));
    ASSERT_EQ(got, host[i]) << "layer " << i / 2 << " kv " << i % 2;
  }
  // A destination one token short is refused before anything is written.
  dd.tokens = tokens - 1;
  auto bad = RestoreIntoGpu(**store, "s", dd, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tqkv
