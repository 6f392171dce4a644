// Capacity planning (`tqkv capacity`): the bytes of one session at FP16 and with a codec, measured
// by a real checkpoint of a synthetic session into a store that keeps nothing (so the container's
// overhead is included), and what they mean for a storage capacity, one GPU and a cluster.
#ifndef TQKV_INCLUDE_TQKV_CAPACITY_H_
#define TQKV_INCLUDE_TQKV_CAPACITY_H_

#include <cstdint>
#include <string>

#include "tqkv/checkpoint.h"
#include "tqkv/status.h"
#include "tqkv/kv_cache.h"

namespace tqkv {

struct CapacityOptions {
  std::string model;             // names the synthetic session (e.g. a preset name)
  ModelGeometry geometry;
  uint64_t tokens = 10000;       // tokens per session
  CheckpointOptions checkpoint;  // codec, per-layer overrides, exact rows, encode pool
  double capacity_bytes = 0;     // storage capacity
  double per_gpu_bytes = 0;      // FP16 KV storage one GPU needs today; 0: no per-GPU figures
  uint64_t gpus = 0;             // GPUs in the cluster; 0: no cluster figures
};

struct CapacityPlan {
  uint64_t fp16_session_bytes = 0;
  uint64_t codec_session_bytes = 0;  // the committed container
  double ratio = 0;                  // fp16_session_bytes / codec_session_bytes
  double sessions_fp16 = 0;          // whole sessions in capacity_bytes
  double sessions_codec = 0;
  double per_gpu_bytes_codec = 0;    // per_gpu_bytes / ratio
  double cluster_bytes_fp16 = 0;     // per_gpu_bytes x gpus
  double cluster_bytes_codec = 0;
};

// Checkpoints a seeded synthetic session (the `kv` distribution, seed 1, f16) of the geometry;
// InvalidArgument for an empty geometry or a bad codec, as Checkpoint() says.
Result<CapacityPlan> PlanCapacity(const CapacityOptions& options);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_CAPACITY_H_
