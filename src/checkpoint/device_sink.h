// The host half of the GPU restore: a ChunkSink that plans each verified chunk's device work
// (which codec, which bytes of the slot, where the group metadata and the rows go) and hands it
// to a RestoreDevice. The CUDA device is src/checkpoint/gpu/cuda_device.cc (built only with
// CUDA); the tests drive the same sink with a host fake, so verification and planning are tested
// without a GPU. docs/gpu.md has the design.
#ifndef TQKV_SRC_CHECKPOINT_DEVICE_SINK_H_
#define TQKV_SRC_CHECKPOINT_DEVICE_SINK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/chunk_loop.h"
#include "checkpoint/session_codecs.h"
#include "tqkv/codec.h"
#include "tqkv/container.h"
#include "tqkv/status.h"

namespace tqkv {

// The codecs a device restore uses, in device order: header.codecs, then the exact-rows codec
// (raw, source dtype) last; and where each layer's group metadata goes in one device array
// [layer][kv][head][meta_bytes of that kv's codec].
struct DevicePlan {
  std::vector<CodecParams> codecs;
  // The header's decoders, for the host's check of each group-meta chunk (CheckGroupMetaChunk):
  // the kernels trust what they are given.
  std::shared_ptr<const SessionCodecs> decoders;
  std::vector<uint64_t> meta_at;  // per layer: offset of its metadata
  uint64_t meta_total = 0;
  // Key means (format version 4) in one device array [layer][kv_head][mean block][head_dim] of
  // the header's key_mean_dtype: per layer the offset of its means, kNoMeans when it has none.
  static constexpr uint64_t kNoMeans = ~uint64_t{0};
  std::vector<uint64_t> means_at;
  uint64_t means_total = 0;
  uint16_t exact_codec() const { return static_cast<uint16_t>(codecs.size() - 1); }
};
Result<DevicePlan> MakeDevicePlan(const ContainerHeader& header);

// One device operation on a slot's bytes, planned on the host.
struct DeviceOp {
  enum Kind : uint8_t {
    kStoreMeta,  // copy `bytes` from the slot to the metadata array at meta_offset
    kCodes,      // decode a codes chunk (a raw codec: copy/convert) into (layer, kv)
    kExactRows,  // copy exact rows (codec exact_codec()) over (layer, kv)'s decoded rows
    kStoreMeans, // copy `bytes` from the slot to the key-means array at means_offset
  };
  static constexpr uint64_t kNoMeta = ~uint64_t{0};
  Kind kind = kCodes;
  uint16_t codec = 0;         // index into DevicePlan::codecs
  uint32_t layer = 0;
  uint8_t kv = 0;
  uint64_t src_offset = 0;    // bytes into the payload (PlanDeviceOps); into the slot (Run)
  uint64_t bytes = 0;         // kStoreMeta
  uint64_t meta_offset = kNoMeta;  // kStoreMeta: destination; kCodes: the (layer, kv) masks
  // kStoreMeans: destination; kCodes of centered keys: the layer's means (DevicePlan::means_at),
  // added to each decoded vector before the conversion; else kNoMeta.
  uint64_t means_offset = kNoMeta;
  uint64_t token_begin = 0;
  uint32_t token_count = 0;
};

// Corruption for a metadata or key-means chunk of the wrong size; otherwise the operations of chunk `e`.
Status PlanDeviceOps(const ContainerHeader& header, const DevicePlan& plan, const ChunkEntry& e,
                     std::string_view name, std::vector<DeviceOp>* ops);

// What the device sink asks of a device. Calls come from the consuming thread, in chunk order.
class RestoreDevice {
 public:
  virtual ~RestoreDevice() = default;
  // Host-visible staging slots the reads land in (pinned for the DMA engine).
  virtual Result<std::vector<std::span<uint8_t>>> AllocateSlots(size_t count, size_t bytes) = 0;
  // Makes bytes [offset, offset + bytes) of slot `slot` (a chunk's payload within its extent)
  // available at the same offset of the device slot, ordered after the slot's previous
  // operations; nothing to do where the read put them there (cuFile).
  virtual Status Upload(size_t slot, size_t offset, size_t bytes) = 0;
  // Enqueues `ops` on the slot's device bytes.
  virtual Status Run(size_t slot, std::span<const DeviceOp> ops) = 0;
  // Every chunk of `layer` is enqueued.
  virtual Status LayerReady(uint32_t layer) = 0;
  // As ChunkSink::held_slots / Retire.
  virtual size_t held_slots() const = 0;
  virtual Status Retire(size_t slot) = 0;
};

class DeviceSink final : public ChunkSink {
 public:
  // `reader` and `device` outlive the sink; `plan` is MakeDevicePlan(reader.header()).
  DeviceSink(const ContainerReader& reader, RestoreDevice& device, DevicePlan plan,
             std::string name);
  const DevicePlan& plan() const { return plan_; }

  Result<std::vector<std::span<uint8_t>>> AllocateSlots(size_t count, size_t bytes) override {
    return device_.AllocateSlots(count, bytes);
  }
  // Plans and checks first: a chunk the plan refuses, or group metadata Decode would refuse, is
  // never uploaded.
  Status Consume(size_t slot, size_t index, std::span<const uint8_t> payload) override;
  Status LayerDone(uint32_t layer) override { return device_.LayerReady(layer); }
  size_t held_slots() const override { return device_.held_slots(); }
  Status Retire(size_t slot) override { return device_.Retire(slot); }

 private:
  const ContainerReader& reader_;
  RestoreDevice& device_;
  std::string name_;
  DevicePlan plan_;
  std::vector<DeviceOp> ops_;
};

// The GPU restore's pipeline over any device: the chunk loop (verified chunks) into a DeviceSink.
// `plan` is MakeDevicePlan(reader.header()); the device was built for it.
Status RunDeviceRestore(ContainerReader& reader, const DevicePlan& plan, RestoreDevice& device,
                        const ChunkLoopOptions& options, const std::string& name,
                        ChunkLoopStats* stats = nullptr);

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_DEVICE_SINK_H_
