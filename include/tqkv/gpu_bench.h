// The GPU codec benchmark (`tqkv-bench gpu`, docs/gpu.md): encode and decode throughput on the
// device against a device-to-device copy. Built only with TQKV_ENABLE_CUDA (src/cuda/bench.cc).
#ifndef TQKV_INCLUDE_TQKV_GPU_BENCH_H_
#define TQKV_INCLUDE_TQKV_GPU_BENCH_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "tqkv/status.h"

namespace tqkv {

// GPU codec benchmark (bench of docs/gpu.md): random vectors of `heads` x `head_dim`, `tokens`
// tokens, encoded on the GPU, checked against the CPU codec on a sample (codes and decoded f16
// bytes), then decode timed into f16 against a device-to-device cudaMemcpy of the same output bytes
// in the same run. DeviceError without a device.
struct GpuCodecBench {
  std::string codec;
  uint64_t vectors = 0;
  uint64_t output_bytes = 0;         // f16 bytes written by one decode
  uint64_t code_bytes = 0;           // bytes read by one decode
  double decode_seconds = 0;         // median of the timed launches
  double encode_seconds = 0;
  double copy_seconds = 0;           // median D2D cudaMemcpy of output_bytes
  double decode_gbps = 0;            // output_bytes / decode_seconds
  double copy_gbps = 0;              // output_bytes / copy_seconds
  double decode_vs_copy = 0;         // decode_gbps / copy_gbps
  uint64_t sample_vectors = 0;       // vectors compared with the CPU codec
  uint64_t code_mismatches = 0;      // codes (vectors) differing from the CPU codec
  uint64_t decode_mismatches = 0;    // decoded f16 values differing from the CPU codec
  std::string ToJson() const;
};
Result<GpuCodecBench> BenchGpuCodec(std::string_view codec_spec, uint32_t heads, uint32_t head_dim,
                                    uint64_t tokens, int iterations = 10);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_GPU_BENCH_H_
