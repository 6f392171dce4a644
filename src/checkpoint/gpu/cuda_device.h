// The CUDA device of the GPU restore (device_sink.h): pinned host slots and device slots with
// events, a copy and a decode stream overlapping across chunks, decode into the destination's
// device tensors (device_destination.h) with an event per layer, and the cuFile transport that
// reads straight into the device slots. Built only with CUDA.
#ifndef TQKV_SRC_CHECKPOINT_GPU_CUDA_DEVICE_H_
#define TQKV_SRC_CHECKPOINT_GPU_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/device_sink.h"
#include "checkpoint/gpu/device_destination.h"
#include "cuda/cufile.h"
#include "cuda/params.h"
#include "tqkv/container.h"
#include "tqkv/gpu.h"

namespace tqkv::gpu {

// cuFile state of one restore: the file handle and registered device slots.
struct GdsFile {
  cuda::CuFileApi api;
  int fd = -1;
  void* handle = nullptr;
  bool driver_open = false;
  std::vector<const void*> registered;
  ~GdsFile();
};

class CudaRestoreDevice final : public RestoreDevice {
 public:
  struct Config {
    const ContainerHeader* header = nullptr;
    const DevicePlan* plan = nullptr;
    const LayoutTensors* dst = nullptr;  // device tensors, checked (CheckDeviceDestination)
    const std::vector<cudaEvent_t>* layer_events = nullptr;  // one per layer, recorded here
    const GpuRestoreOptions* options = nullptr;
    size_t slots = 0, slot_bytes = 0;    // ChunkLoopSlots
  };
  CudaRestoreDevice() = default;
  ~CudaRestoreDevice() override;
  CudaRestoreDevice(const CudaRestoreDevice&) = delete;
  CudaRestoreDevice& operator=(const CudaRestoreDevice&) = delete;

  // Packs and uploads the codecs and the block table, allocates streams, metadata and slots.
  Status Init(const Config& config, const std::string& name);
  // Opens `path` for cuFile reads into the device slots; Upload is then a no-op.
  Status OpenGds(const std::string& path, const std::vector<std::string>& libs);
  // The transport of the gds rung: cuFileRead into the device slot, a copy of the extent back to
  // the host slot, verified there (VerifyChunkExtent) before the sink sees the chunk.
  SlotReadFn GdsRead(const ContainerReader& reader, const std::string& name);
  uint64_t cufile_bytes() const { return cufile_bytes_.load(); }

  Result<std::vector<std::span<uint8_t>>> AllocateSlots(size_t count, size_t bytes) override;
  Status Upload(size_t slot, size_t offset, size_t bytes) override;
  Status Run(size_t slot, std::span<const DeviceOp> ops) override;
  Status LayerReady(uint32_t layer) override;
  size_t held_slots() const override { return std::max<size_t>(1, slots_.size() / 2) - 1; }
  Status Retire(size_t slot) override;

  // Records the start on the decode stream (before the first chunk).
  Status Start();
  // Waits for both streams; then the timings below are final.
  Status Finish();
  double copy_seconds() const;
  double decode_seconds() const;
  double first_layer_seconds() const;  // from Start until layer 0's event

 private:
  struct Slot {
    uint8_t* host = nullptr;  // pinned (cudaHostAlloc: page-aligned, so O_DIRECT reads land here)
    uint8_t* dev = nullptr;
    cudaEvent_t copied = nullptr;   // H2D copy into dev done (host slot reusable)
    cudaEvent_t decoded = nullptr;  // consumer of dev done (dev slot reusable)
  };
  using EventPair = std::pair<cudaEvent_t, cudaEvent_t>;
  Result<void*> Malloc(size_t bytes);
  Result<EventPair> TimingPair();
  Status UploadBlockTable();
  Status RunOp(const Slot& s, const DeviceOp& op);
  cuda::GpuDst DstOf(uint32_t layer, int kv) const;

  Config c_;
  std::vector<cuda::PackedCodec> packed_;  // DevicePlan::codecs, tables uploaded
  std::vector<Slot> slots_;
  size_t dev_slot_bytes_ = 0;
  cudaStream_t copy_ = nullptr, decode_ = nullptr;
  std::vector<void*> dev_allocs_;
  std::vector<cudaEvent_t> timing_;  // every event below, destroyed with the device
  std::vector<EventPair> copy_times_, decode_times_;
  cudaEvent_t start_ = nullptr;
  uint8_t* dmeta_ = nullptr;
  uint8_t* dmeans_ = nullptr;  // DevicePlan::means_total bytes: every layer's key means
  int64_t* dblocks_ = nullptr;  // the destination's block ids (paged layouts)
  bool gds_ = false;
  GdsFile gds_file_;
  std::atomic<uint64_t> cufile_bytes_{0};  // cuFile reads bypass the object's byte count
};

}  // namespace tqkv::gpu

#endif  // TQKV_SRC_CHECKPOINT_GPU_CUDA_DEVICE_H_
