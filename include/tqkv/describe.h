// A stored container described for people and scripts: what `tqkv inspect` prints.
#ifndef TQKV_INCLUDE_TQKV_DESCRIBE_H_
#define TQKV_INCLUDE_TQKV_DESCRIBE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/container.h"

namespace tqkv {

struct ContainerDescription {
  ContainerHeader header;           // as stored
  std::vector<ChunkEntry> chunks;   // the index, container order
  uint64_t file_bytes = 0;
  uint64_t fp16_bytes = 0;          // the session's tensors at FP16
  double ratio = 0;                 // fp16_bytes / file_bytes (0 for an empty file)
  double bits_per_value = 0;        // every stored bit per K/V element (0 for no tokens)
  std::string codec;                // layer 0's K and V codecs (KvCodecLabel: "tq3", "k4v2")
  std::vector<std::string> codecs;  // CodecLabel of each of header.codecs
  std::vector<std::string> layer_codecs;  // per layer, as `codec`
};

// Describes an opened container (no I/O: everything comes from the parsed header and index).
ContainerDescription DescribeContainer(const ContainerReader& reader);

// "meta", "means", "exact", "K" or "V".
std::string_view ChunkTypeLabel(const ChunkEntry& entry);

// The description as JSON text (2-space indented, keys sorted; the chunk table only when
// `with_chunks`): what `tqkv inspect --json` prints.
std::string ContainerDescriptionJson(const ContainerDescription& description, bool with_chunks);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_DESCRIBE_H_
