// Restore a checkpointed session straight into GPU memory (built only with TQKV_ENABLE_CUDA; the
// library then defines TQKV_HAVE_CUDA). docs/gpu.md has the design.
//
// I/O ladder, probed at start and reported in every result (docs/gpu.md):
//   gds       cuFile reads into registered device buffers (libcufile dlopen'ed at run time)
//   direct    O_DIRECT / io_uring reads into pinned host slots + cudaMemcpyAsync
//   buffered  page-cache reads into pinned host slots + cudaMemcpyAsync
// Chunks are decoded on the GPU (bit-identical to the CPU codec) into device tensors of the
// library (canonical [tokens][kv_heads][head_dim] per layer and K/V) or straight into the caller's
// (any KvLayout with contiguous channels, vLLM's paged blocks included). Each layer gets a CUDA
// event recorded when its K and V are decoded, so an engine can start on layer 0 early.
//
// Without a CUDA device (or driver) nothing crashes: the probe says "no CUDA device: ..." and
// RestoreToGpu returns DeviceError with that reason.
#ifndef TQKV_INCLUDE_TQKV_GPU_H_
#define TQKV_INCLUDE_TQKV_GPU_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/gpu_probe.h"
#include "tqkv/kv_cache.h"
#include "tqkv/batch.h"
#include "tqkv/kv_layout.h"
#include "tqkv/status.h"
#include "tqkv/store.h"
#include "tqkv/types.h"

namespace tqkv {

struct GpuRestoreOptions {
  DType dtype = DType::kF16;         // RestoreToGpu's output type: f16, bf16 or f32
  std::optional<GpuIoPath> io;       // forced rung (refused with the probe's reason if unusable)
  int device = 0;
  uint64_t inflight_bytes = 64 << 20;  // pinned / device staging budget
  std::vector<std::string> cufile_libraries;  // as GpuProbeOptions
  // Called on the restoring thread as soon as layer `layer`'s decode is enqueued, with its
  // cudaEvent_t (valid until the restore returns): an engine running the restore on a side thread
  // can cudaStreamWaitEvent on it and start layer 0 while later layers are still being read. An
  // error return stops the restore with that error.
  std::function<Status(uint32_t layer, void* event)> on_layer;
  // When set, the stored model string must equal it (else InvalidArgument, before any device
  // memory is written), as RestoreOptions::expect_model.
  std::optional<std::string> expect_model;
};

struct GpuRestoreStats {
  GpuIoPath path = GpuIoPath::kBuffered;
  std::string host_io;              // the store's real host I/O mode (pinned rungs)
  std::vector<std::string> skipped; // "gds: <reason>", ... for rungs above the chosen one
  uint64_t bytes_read = 0;
  uint64_t fp16_bytes = 0;
  uint64_t tokens = 0;
  std::string model;
  ModelGeometry geometry;
  double seconds = 0;               // wall: open to every layer decoded (device synchronised)
  double setup_seconds = 0;         // part of `seconds` before the first read: probe, allocations
  double read_busy_seconds = 0;     // reader thread inside store reads / cuFileRead
  double copy_seconds = 0;          // GPU time of the H2D copies (event timing)
  double decode_seconds = 0;        // GPU time of the decode kernels (event timing)
  double first_layer_seconds = 0;   // wall from open until layer 0's event completed
  std::string ToJson() const;
};

// The host I/O mode of the store a GPU restore over rung `io` reads (a name as `tqkv restore
// --target gpu --io` takes it): the store's own reads (header, index; every chunk on the pinned
// rungs) follow the rung. buffered -> buffered, direct and gds -> direct (cuFile reads the chunks,
// the header and index go through O_DIRECT), uring -> uring (the direct rung over io_uring).
// Open the store with it: OpenExistingStore(uri, {.io = *GpuStoreIo(io)}), and force the rung
// with GpuRestoreOptions::io = ParseGpuIoPath(io). InvalidArgument for another name.
Result<IoMode> GpuStoreIo(std::string_view io);

// Device tensors of a restored session; owns the device memory and the events.
class GpuSession {
 public:
  virtual ~GpuSession() = default;
  virtual const ModelGeometry& geometry() const = 0;
  virtual uint64_t tokens() const = 0;
  virtual DType dtype() const = 0;
  // Device pointer of layer `layer`'s K (kv 0) or V (kv 1).
  virtual void* tensor(uint32_t layer, int kv) const = 0;
  // cudaEvent_t recorded when the layer is ready (as void* to keep CUDA out of this header).
  virtual void* layer_event(uint32_t layer) const = 0;
  virtual Status WaitLayer(uint32_t layer) const = 0;
  virtual const GpuRestoreStats& stats() const = 0;
};

// Restores `key` from `store` into device tensors of its own, canonical [tokens][kv_heads]
// [head_dim] per (layer, K/V) of options.dtype. Returns once every layer is ready (the per-layer
// events and first_layer_seconds show when each became ready).
// DeviceError without a device or on a CUDA failure; Unsupported for codecs the kernels do not
// handle (qjl) or a forced rung that is not usable; errors of the store/container as they are.
Result<std::unique_ptr<GpuSession>> RestoreToGpu(Store& store, std::string_view key,
                                                 const GpuRestoreOptions& options);

// Restores `key` straight into the caller's device tensors: dst.k[l] / dst.v[l] are device
// pointers on options.device, in dst.layout (kv_layout.h: canonical, strided or paged, as for a
// host RestoreInto) with each head's channels contiguous, of dst.dtype (f16, bf16 or f32;
// options.dtype is not used). The session's geometry and token count must equal dst's and every
// element must lie inside dst.tensor_elems: otherwise InvalidArgument before anything is read or
// written. Device memory used besides dst: staging slots, codec tables, group metadata, key means
// and the block table, never a second copy of the session. Returns once every layer is decoded;
// options.on_layer fires per layer as above. Errors as RestoreToGpu.
Result<GpuRestoreStats> RestoreIntoGpu(Store& store, std::string_view key, const LayoutTensors& dst,
                                       const GpuRestoreOptions& options);

// RestoreBatch (batch.h) into device tensors: objects[i] into blocks objects[i].block_ids of
// `dst` (paged, dst.tokens per object), each through RestoreIntoGpu with its header's model
// (objects[i].model unless empty), geometry and tokens checked first, one object after another;
// options.on_layer(l, event) fires for the last object's layer l, i.e. once layer l of every
// object is enqueued. A failed object fails itself and the later ones (stats->done before it).
Status RestoreBatchIntoGpu(Store& store, std::span<const BatchObject> objects,
                           const LayoutTensors& dst, const GpuRestoreOptions& options,
                           BatchStats* stats = nullptr);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_GPU_H_
