// Shared by checkpoint and restore: codecs of a session and chunk sizing.
#ifndef TQKV_SRC_CHECKPOINT_SESSION_CODECS_H_
#define TQKV_SRC_CHECKPOINT_SESSION_CODECS_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tqkv/checkpoint.h"
#include "tqkv/codec.h"
#include "tqkv/container.h"

namespace tqkv {

struct SessionCodecs {
  std::vector<std::unique_ptr<Codec>> codecs;  // distinct
  std::vector<uint16_t> layer_codec;           // per layer: K's index into codecs
  std::vector<uint16_t> layer_codec_v;         // per layer: V's index (same size)

  const Codec& of(uint32_t layer, int kv) const {
    return *codecs[kv == 0 ? layer_codec[layer] : layer_codec_v[layer]];
  }
};

// Builds the distinct codecs of a checkpoint (default K/V specs + per-layer overrides).
Result<SessionCodecs> ResolveSessionCodecs(const CheckpointOptions& options,
                                           const ModelGeometry& geometry);
// Builds decoders from a container header.
Result<SessionCodecs> SessionCodecsFromHeader(const ContainerHeader& header);
// Every group metadata of layer e.layer's group-meta chunk ([K heads][K meta] then [V heads][V
// meta], docs/format.md §5) as Decode would check it: one Decode refuses is the container's
// corruption, named here. Host and GPU restores check each such chunk when it arrives, before
// any decode reads it.
Status CheckGroupMetaChunk(const SessionCodecs& codecs, const ContainerHeader& header,
                           const ChunkEntry& e, std::span<const uint8_t> payload,
                           const std::string& name);
// The decoder of a header's exact-rows chunk: a raw codec of the source dtype (converted on decode).
Result<std::unique_ptr<Codec>> ExactRowsCodec(const ContainerHeader& header);
// Tokens per chunk for chunks of about 2 MiB (a multiple of 16, at least 16).
uint32_t DefaultTokenBlock(const SessionCodecs& codecs, const ModelGeometry& geometry);

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_SESSION_CODECS_H_
