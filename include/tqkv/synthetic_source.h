// A seeded synthetic session (the codec bench's `kv` distribution), produced layer by layer so a
// session of any length can be checkpointed without holding it in memory.
#ifndef TQKV_INCLUDE_TQKV_SYNTHETIC_SOURCE_H_
#define TQKV_INCLUDE_TQKV_SYNTHETIC_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "tqkv/kv_source.h"

namespace tqkv {

std::unique_ptr<KvSource> MakeSyntheticSource(std::string model, ModelGeometry geometry,
                                              DType dtype, uint64_t tokens, uint64_t seed);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_SYNTHETIC_SOURCE_H_
