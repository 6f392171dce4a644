#include "checkpoint/device_sink.h"

#include <memory>
#include <utility>

#include "checkpoint/destination.h"

namespace tqkv {

Result<DevicePlan> MakeDevicePlan(const ContainerHeader& h) {
  // Device destinations are one tensor shape for every layer (LayoutTensors::tokens).
  TQKV_RETURN_IF_ERROR(RefuseRagged(h, "a GPU restore"));
  DevicePlan plan;
  plan.codecs = h.codecs;
  TQKV_ASSIGN_OR_RETURN(std::unique_ptr<Codec> exact, ExactRowsCodec(h));
  plan.codecs.push_back(exact->params());
  TQKV_ASSIGN_OR_RETURN(SessionCodecs decoders, SessionCodecsFromHeader(h));
  plan.decoders = std::make_shared<const SessionCodecs>(std::move(decoders));
  plan.meta_at.assign(h.geometry.layers, 0);
  for (uint32_t l = 0; l < h.geometry.layers; ++l) {
    plan.meta_at[l] = plan.meta_total;
    plan.meta_total += LayerGroupMetaBytes(h, l);
  }
  plan.means_at.assign(h.geometry.layers, DevicePlan::kNoMeans);
  for (uint32_t l = 0; l < h.geometry.layers; ++l) {
    if (!LayerHasKeyMeans(h, l)) continue;
    plan.means_at[l] = plan.means_total;
    plan.means_total += KeyMeanValues(h, l) * DTypeSize(h.key_mean_dtype);  // ValidateHeader
  }
  return plan;
}

Status PlanDeviceOps(const ContainerHeader& h, const DevicePlan& plan, const ChunkEntry& e,
                     std::string_view name, std::vector<DeviceOp>* ops) {
  ops->clear();
  const uint16_t codec = LayerCodecIndex(h, e.layer, e.kv);
  const uint64_t heads = h.geometry.kv_heads;
  const uint64_t meta_bytes = GroupMetaBytesOf(plan.codecs[codec]);
  const uint64_t k_meta_bytes = GroupMetaBytesOf(plan.codecs[LayerCodecIndex(h, e.layer, 0)]);
  DeviceOp op;
  op.codec = codec;
  op.layer = e.layer;
  op.kv = e.kv;
  if (e.type == ChunkType::kGroupMeta) {
    if (e.size != LayerGroupMetaBytes(h, e.layer)) {
      return Status::Corruption(std::string(name) + ": layer " + std::to_string(e.layer) +
                                " group metadata has " + std::to_string(e.size) + " bytes");
    }
    op.kind = DeviceOp::kStoreMeta;
    op.bytes = e.size;
    op.meta_offset = plan.meta_at[e.layer];
    ops->push_back(op);
  } else if (e.type == ChunkType::kKeyMeans) {
    const uint64_t want = KeyMeanValues(h, e.layer) * DTypeSize(h.key_mean_dtype);
    if (plan.means_at[e.layer] == DevicePlan::kNoMeans || e.size != want) {
      return Status::Corruption(std::string(name) + ": layer " + std::to_string(e.layer) +
                                " key means have " + std::to_string(e.size) + " bytes");
    }
    op.kind = DeviceOp::kStoreMeans;
    op.bytes = e.size;
    op.means_offset = plan.means_at[e.layer];
    ops->push_back(op);
  } else if (e.type == ChunkType::kExactRows) {
    // K then V, each range head-major (container.h).
    op.kind = DeviceOp::kExactRows;
    op.codec = plan.exact_codec();
    const uint64_t vec = CodeBytesOf(plan.codecs[op.codec]);
    for (uint8_t kv = 0; kv < 2; ++kv) {
      for (const TokenRange& range : ExactRanges(h, e.layer)) {
        if (range.count == 0) continue;
        op.kv = kv;
        op.token_begin = range.begin;
        op.token_count = static_cast<uint32_t>(range.count);
        ops->push_back(op);
        op.src_offset += heads * range.count * vec;
      }
    }
  } else {
    op.kind = DeviceOp::kCodes;
    // [K heads][K meta] then [V heads][V meta] (docs/format.md §5).
    if (meta_bytes > 0) op.meta_offset = plan.meta_at[e.layer] + e.kv * heads * k_meta_bytes;
    if (e.kv == 0) op.means_offset = plan.means_at[e.layer];
    op.token_begin = e.token_begin;
    op.token_count = static_cast<uint32_t>(e.token_count);
    ops->push_back(op);
  }
  return Status::Ok();
}

DeviceSink::DeviceSink(const ContainerReader& reader, RestoreDevice& device, DevicePlan plan,
                       std::string name)
    : reader_(reader), device_(device), name_(std::move(name)), plan_(std::move(plan)) {}

Status DeviceSink::Consume(size_t slot, size_t index, std::span<const uint8_t> payload) {
  const ChunkEntry& e = reader_.chunks()[index];
  TQKV_RETURN_IF_ERROR(PlanDeviceOps(reader_.header(), plan_, e, name_, &ops_));
  if (e.type == ChunkType::kGroupMeta) {
    TQKV_RETURN_IF_ERROR(CheckGroupMetaChunk(*plan_.decoders, reader_.header(), e, payload, name_));
  }
  // The slot holds the chunk's extent: the payload starts inside it below 4 KiB alignment.
  const uint64_t at = reader_.PayloadOffsetInExtent(index);
  for (DeviceOp& op : ops_) op.src_offset += at;
  TQKV_RETURN_IF_ERROR(device_.Upload(slot, static_cast<size_t>(at), payload.size()));
  return device_.Run(slot, ops_);
}

Status RunDeviceRestore(ContainerReader& reader, const DevicePlan& plan, RestoreDevice& device,
                        const ChunkLoopOptions& options, const std::string& name,
                        ChunkLoopStats* stats) {
  DeviceSink sink(reader, device, plan, name);
  return RunChunkLoop(reader, sink, options, stats);
}

}  // namespace tqkv
