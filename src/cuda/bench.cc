// BenchGpuCodec (gpu.h): GPU encode/decode throughput against a same-run D2D copy, with a CPU check.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "cuda/common.h"
#include "cuda/kernels.h"
#include "cuda/params.h"
#include "tqkv/codec.h"
#include "tqkv/gpu_bench.h"
#include "tqkv/gpu_probe.h"

namespace tqkv {
namespace {

struct DevMem {
  void* p = nullptr;
  ~DevMem() {
    if (p) cudaFree(p);
  }
};
struct Ev {
  cudaEvent_t e = nullptr;
  ~Ev() {
    if (e) cudaEventDestroy(e);
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

std::string GpuCodecBench::ToJson() const {
  nlohmann::json j = {{"codec", codec},
                      {"vectors", vectors},
                      {"output_bytes", output_bytes},
                      {"code_bytes", code_bytes},
                      {"decode_s", decode_seconds},
                      {"encode_s", encode_seconds},
                      {"copy_s", copy_seconds},
                      {"decode_gbps_fp16_out", decode_gbps},
                      {"d2d_copy_gbps", copy_gbps},
                      {"decode_vs_copy", decode_vs_copy},
                      {"sample_vectors", sample_vectors},
                      {"code_mismatches", code_mismatches},
                      {"decode_mismatches", decode_mismatches}};
  return j.dump(2);
}

Result<GpuCodecBench> BenchGpuCodec(std::string_view codec_spec, uint32_t heads, uint32_t head_dim,
                                    uint64_t tokens, int iterations) {
  TQKV_ASSIGN_OR_RETURN(int devices, CudaDeviceCount());
  (void)devices;
  TQKV_ASSIGN_OR_RETURN(CodecSpec spec, ParseCodecSpec(codec_spec));
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, Codec::Create(spec, head_dim));
  TQKV_ASSIGN_OR_RETURN(cuda::PackedCodec pc, cuda::PackCodecParams(codec->params()));
  if (pc.params.kind != cuda::kGpuTurboQuant || pc.params.meta_bytes != 0) {
    return Status::InvalidArgument("BenchGpuCodec: an unsplit TurboQuant codec, e.g. tq3");
  }
  GpuCodecBench b;
  b.codec = std::string(codec_spec);
  b.vectors = tokens * heads;
  const size_t d = head_dim, cb = codec->code_bytes();
  b.output_bytes = b.vectors * d * 2;
  b.code_bytes = b.vectors * cb;
  // Inputs: f16 values of a deterministic pseudo-Gaussian (sum of 4 uniforms), [token][head][d].
  std::vector<uint16_t> x(b.vectors * d);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (auto& v : x) {
    float s = 0;
    for (int k = 0; k < 4; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      s += static_cast<float>(state >> 40) / 16777216.0f - 0.5f;
    }
    v = FloatToHalf(s * 1.7f);
  }
  DevMem dx, dcodes, dout, dcopy, dtable;
  TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&dx.p, x.size() * 2));
  TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&dcodes.p, b.code_bytes));
  TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&dout.p, b.output_bytes));
  TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&dcopy.p, b.output_bytes));
  TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&dtable.p, pc.table.size() * 4));
  TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(dtable.p, pc.table.data(), pc.table.size() * 4, cudaMemcpyHostToDevice));
  pc.params.table = static_cast<const float*>(dtable.p);
  TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(dx.p, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  Ev a, z;
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&a.e));
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&z.e));
  auto timed = [&](auto&& launch) -> Result<double> {
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(a.e));
    TQKV_CUDA_RETURN_IF_ERROR(launch());
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(z.e));
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(z.e));
    float ms = 0;
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a.e, z.e));
    return ms / 1e3;
  };
  const auto tok32 = static_cast<uint32_t>(tokens);
  auto encode = [&] {
    return cuda::LaunchEncode(pc.params, dx.p, cuda::kGpuF16, nullptr, heads, tok32,
                              static_cast<uint8_t*>(dcodes.p), nullptr);
  };
  const cuda::GpuDst dst = cuda::CanonicalDst(dout.p, heads, head_dim, cuda::kGpuF16);
  auto decode = [&] {
    return cuda::LaunchDecode(pc.params, static_cast<const uint8_t*>(dcodes.p), nullptr, heads, 0,
                              tok32, dst, nullptr);
  };
  auto copy = [&] {
    return cudaMemcpyAsync(dcopy.p, dout.p, b.output_bytes, cudaMemcpyDeviceToDevice, nullptr);
  };
  std::vector<double> enc_t, dec_t, copy_t;
  for (int i = 0; i <= iterations; ++i) {  // the first round is a warm-up
    TQKV_ASSIGN_OR_RETURN(double te, timed(encode));
    TQKV_ASSIGN_OR_RETURN(double td, timed(decode));
    TQKV_ASSIGN_OR_RETURN(double tc, timed(copy));
    if (i > 0) {
      enc_t.push_back(te);
      dec_t.push_back(td);
      copy_t.push_back(tc);
    }
  }
  b.encode_seconds = Median(enc_t);
  b.decode_seconds = Median(dec_t);
  b.copy_seconds = Median(copy_t);
  b.decode_gbps = b.decode_seconds > 0 ? b.output_bytes / b.decode_seconds / 1e9 : 0;
  b.copy_gbps = b.copy_seconds > 0 ? b.output_bytes / b.copy_seconds / 1e9 : 0;
  b.decode_vs_copy = b.copy_gbps > 0 ? b.decode_gbps / b.copy_gbps : 0;

  // CPU check on head 0's first tokens: codes (head-major) and decoded f16 bytes.
  const uint64_t sample = std::min<uint64_t>(tokens, 4096);
  b.sample_vectors = sample;
  std::vector<uint8_t> gpu_codes(sample * cb), cpu_codes(sample * cb);
  TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(gpu_codes.data(), dcodes.p, gpu_codes.size(), cudaMemcpyDeviceToHost));
  TQKV_RETURN_IF_ERROR(codec->Encode(x.data(), DType::kF16, sample, heads * d, {}, cpu_codes));
  for (uint64_t i = 0; i < sample; ++i) {
    b.code_mismatches += std::memcmp(&gpu_codes[i * cb], &cpu_codes[i * cb], cb) != 0;
  }
  std::vector<uint16_t> gpu_out(sample * heads * d), cpu_out(sample * d);
  TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(gpu_out.data(), dout.p, gpu_out.size() * 2, cudaMemcpyDeviceToHost));
  TQKV_RETURN_IF_ERROR(codec->Decode(cpu_codes, sample, {}, cpu_out.data(), DType::kF16, d));
  for (uint64_t i = 0; i < sample; ++i) {
    for (size_t c = 0; c < d; ++c) b.decode_mismatches += gpu_out[i * heads * d + c] != cpu_out[i * d + c];
  }
  return b;
}

}  // namespace tqkv
