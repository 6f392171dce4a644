#include "checkpoint/gpu/cuda_device.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "cuda/common.h"
#include "cuda/kernels.h"
#include "tqkv/aligned_buffer.h"

namespace tqkv::gpu {
namespace {

float Elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) return 0;
  return ms;
}

}  // namespace

GdsFile::~GdsFile() {
  for (const void* p : registered) api.BufDeregister(p);
  if (handle) api.HandleDeregister(handle);
  if (fd >= 0) close(fd);
  if (driver_open) api.DriverClose();
}

CudaRestoreDevice::~CudaRestoreDevice() {
  if (copy_) cudaStreamSynchronize(copy_);
  if (decode_) cudaStreamSynchronize(decode_);
  // cuFile buffers are deregistered before the device slots are freed.
  for (const void* p : gds_file_.registered) gds_file_.api.BufDeregister(p);
  gds_file_.registered.clear();
  for (Slot& s : slots_) {
    if (s.host) cudaFreeHost(s.host);
    if (s.dev) cudaFree(s.dev);
    if (s.copied) cudaEventDestroy(s.copied);
    if (s.decoded) cudaEventDestroy(s.decoded);
  }
  for (void* p : dev_allocs_) cudaFree(p);
  for (cudaEvent_t e : timing_) cudaEventDestroy(e);
  if (copy_) cudaStreamDestroy(copy_);
  if (decode_) cudaStreamDestroy(decode_);
}

Result<void*> CudaRestoreDevice::Malloc(size_t bytes) {
  void* p = nullptr;
  TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  dev_allocs_.push_back(p);
  return p;
}

Result<CudaRestoreDevice::EventPair> CudaRestoreDevice::TimingPair() {
  cudaEvent_t a, b;
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&a));
  timing_.push_back(a);
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&b));
  timing_.push_back(b);
  return std::make_pair(a, b);
}

Status CudaRestoreDevice::Init(const Config& config, const std::string& name) {
  c_ = config;
  for (const CodecParams& cp : c_.plan->codecs) {
    Result<cuda::PackedCodec> pc = cuda::PackCodecParams(cp);
    if (!pc.ok()) return Status(pc.status().code(), name + ": " + pc.status().message());
    packed_.push_back(std::move(*pc));
  }
  TQKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  TQKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&decode_, cudaStreamNonBlocking));
  for (cuda::PackedCodec& pc : packed_) {
    const size_t bytes = pc.table.size() * sizeof(float);
    TQKV_ASSIGN_OR_RETURN(void* t, Malloc(bytes));
    if (bytes) TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(t, pc.table.data(), bytes, cudaMemcpyHostToDevice));
    pc.params.table = static_cast<const float*>(t);
  }
  TQKV_ASSIGN_OR_RETURN(void* dmeta, Malloc(c_.plan->meta_total));
  dmeta_ = static_cast<uint8_t*>(dmeta);
  TQKV_ASSIGN_OR_RETURN(void* dmeans, Malloc(c_.plan->means_total));
  dmeans_ = static_cast<uint8_t*>(dmeans);
  TQKV_RETURN_IF_ERROR(UploadBlockTable());
  // Device slots hold whole 4 KiB blocks: cuFile reads round up to them (see GdsRead).
  dev_slot_bytes_ = AlignUp(c_.slot_bytes, kContainerAlignment);
  slots_.resize(c_.slots);
  for (Slot& s : slots_) {
    TQKV_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&s.host), c_.slot_bytes,
                                            cudaHostAllocDefault));
    TQKV_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&s.dev), dev_slot_bytes_));
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.decoded, cudaEventDisableTiming));
  }
  return Status::Ok();
}

Status CudaRestoreDevice::UploadBlockTable() {
  const std::vector<int64_t>& ids = c_.dst->layout.block_ids;
  if (c_.dst->layout.block_tokens == 0 || ids.empty()) return Status::Ok();
  TQKV_ASSIGN_OR_RETURN(void* b, Malloc(ids.size() * sizeof(int64_t)));
  dblocks_ = static_cast<int64_t*>(b);
  TQKV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dblocks_, ids.data(), ids.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status CudaRestoreDevice::OpenGds(const std::string& path, const std::vector<std::string>& libs) {
  GdsFile& g = gds_file_;
  TQKV_ASSIGN_OR_RETURN(g.api, cuda::LoadCuFile(libs));
  cuda::CUfileErrorT e = g.api.DriverOpen();
  if (e.err != 0) return Status::Unsupported("cuFileDriverOpen: " + cuda::CuFileErrorString(e));
  g.driver_open = true;
  g.fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (g.fd < 0) return Status::FromErrno("open(O_DIRECT) for cuFile", path, errno);
  cuda::CUfileDescrT descr{};
  descr.type = cuda::kCuFileHandleTypeOpaqueFd;
  descr.handle.fd = g.fd;
  e = g.api.HandleRegister(&g.handle, &descr);
  if (e.err != 0) {
    g.handle = nullptr;
    return Status::Unsupported("cuFileHandleRegister(" + path + "): " + cuda::CuFileErrorString(e));
  }
  for (Slot& s : slots_) {
    e = g.api.BufRegister(s.dev, dev_slot_bytes_, 0);
    if (e.err != 0) return Status::Unsupported("cuFileBufRegister: " + cuda::CuFileErrorString(e));
    g.registered.push_back(s.dev);
  }
  gds_ = true;
  return Status::Ok();
}

SlotReadFn CudaRestoreDevice::GdsRead(const ContainerReader& reader, const std::string& name) {
  return [this, &reader, name](std::span<const SlotRead> batch) -> Status {
    for (const SlotRead& r : batch) {
      const uint64_t at = reader.ChunkExtentOffset(r.index);  // 4 KiB-aligned
      const Slot& s = slots_[r.slot];
      // The extent rounded up to whole blocks for O_DIRECT, within the file; only the extent
      // is verified and used.
      const size_t len = static_cast<size_t>(std::min<uint64_t>(
          AlignUp(r.dst.size(), kContainerAlignment), reader.file_bytes() - at));
      for (size_t done = 0; done < len;) {
        const ssize_t n = gds_file_.api.Read(gds_file_.handle, s.dev, len - done,
                                             static_cast<off_t>(at + done),
                                             static_cast<off_t>(done));
        if (n <= 0) {
          return Status::IoError(name + ": cuFileRead at offset " + std::to_string(at + done) +
                                 " returned " + std::to_string(n));
        }
        done += static_cast<size_t>(n);
      }
      cufile_bytes_ += len;
      // The container's XXH3 and the padding are checked on the host (docs/gpu.md).
      TQKV_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(r.dst.data(), s.dev, r.dst.size(), cudaMemcpyDeviceToHost));
      TQKV_RETURN_IF_ERROR(reader.VerifyChunkExtent(r.index, r.dst));
    }
    return Status::Ok();
  };
}

Result<std::vector<std::span<uint8_t>>> CudaRestoreDevice::AllocateSlots(size_t count,
                                                                         size_t bytes) {
  if (count != slots_.size() || bytes != c_.slot_bytes) {
    return Status::Internal("CUDA restore device: slots allocated for another geometry");
  }
  std::vector<std::span<uint8_t>> out;
  for (Slot& s : slots_) out.emplace_back(s.host, bytes);
  return out;
}

Status CudaRestoreDevice::Upload(size_t slot, size_t offset, size_t bytes) {
  if (gds_) return Status::Ok();  // cuFile read it into the device slot
  Slot& s = slots_[slot];
  // The previous decode reading this device slot must finish before the copy overwrites it.
  TQKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, s.decoded, 0));
  TQKV_ASSIGN_OR_RETURN(EventPair ct, TimingPair());
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(ct.first, copy_));
  TQKV_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(s.dev + offset, s.host + offset, bytes, cudaMemcpyHostToDevice, copy_));
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(ct.second, copy_));
  copy_times_.push_back(ct);
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.copied, copy_));
  TQKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(decode_, s.copied, 0));
  return Status::Ok();
}

cuda::GpuDst CudaRestoreDevice::DstOf(uint32_t layer, int kv) const {
  return DeviceDst(*c_.dst, layer, kv, dblocks_);
}

Status CudaRestoreDevice::RunOp(const Slot& s, const DeviceOp& op) {
  const cuda::GpuCodecParams& p = packed_[op.codec].params;
  const uint8_t* src = s.dev + op.src_offset;
  const uint32_t heads = c_.header->geometry.kv_heads;
  switch (op.kind) {
    case DeviceOp::kStoreMeta:
      TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dmeta_ + op.meta_offset, src, op.bytes,
                                                cudaMemcpyDeviceToDevice, decode_));
      return Status::Ok();
    case DeviceOp::kStoreMeans:
      TQKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dmeans_ + op.means_offset, src, op.bytes,
                                                cudaMemcpyDeviceToDevice, decode_));
      return Status::Ok();
    case DeviceOp::kExactRows:  // after the layer's codes on the same stream: overwrites them
      TQKV_CUDA_RETURN_IF_ERROR(cuda::LaunchRawCopy(p, src, heads, op.token_begin, op.token_count,
                                                    DstOf(op.layer, op.kv), decode_));
      return Status::Ok();
    case DeviceOp::kCodes: {
      TQKV_ASSIGN_OR_RETURN(EventPair dt, TimingPair());
      TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(dt.first, decode_));
      const uint8_t* masks = op.meta_offset == DeviceOp::kNoMeta ? nullptr : dmeta_ + op.meta_offset;
      const cuda::GpuDst dst = DstOf(op.layer, op.kv);
      cuda::GpuKeyMeans means{};
      if (op.means_offset != DeviceOp::kNoMeta) {
        const ContainerHeader& h = *c_.header;
        const uint8_t* base = dmeans_ + op.means_offset;
        const uint64_t blocks = KeyMeanBlocks(h, op.layer);
        means = {base, base + blocks * h.geometry.token_elems() * DTypeSize(h.key_mean_dtype),
                 cuda::ToGpuDType(h.key_mean_dtype), h.key_mean_block, blocks,
                 LayerTokens(h, op.layer)};
      }
      TQKV_CUDA_RETURN_IF_ERROR(
          p.kind == cuda::kGpuRaw
              ? cuda::LaunchRawCopy(p, src, heads, op.token_begin, op.token_count, dst, decode_)
              : cuda::LaunchDecode(p, src, masks, heads, op.token_begin, op.token_count, dst,
                                   decode_, means));
      TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(dt.second, decode_));
      decode_times_.push_back(dt);
      return Status::Ok();
    }
  }
  return Status::Internal("CUDA restore device: unknown operation");
}

Status CudaRestoreDevice::Run(size_t slot, std::span<const DeviceOp> ops) {
  const Slot& s = slots_[slot];
  for (const DeviceOp& op : ops) TQKV_RETURN_IF_ERROR(RunOp(s, op));
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.decoded, decode_));
  return Status::Ok();
}

Status CudaRestoreDevice::LayerReady(uint32_t layer) {
  cudaEvent_t ev = (*c_.layer_events)[layer];
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev, decode_));
  return c_.options->on_layer ? c_.options->on_layer(layer, ev) : Status::Ok();
}

Status CudaRestoreDevice::Retire(size_t slot) {
  // Host slot reuse needs the copy done; device slot reuse is ordered by the streams, except for
  // cuFile, which writes the device slot from the reader thread: wait for its decode.
  const Slot& s = slots_[slot];
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(gds_ ? s.decoded : s.copied));
  return Status::Ok();
}

Status CudaRestoreDevice::Start() {
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_));
  timing_.push_back(start_);
  TQKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, decode_));
  return Status::Ok();
}

Status CudaRestoreDevice::Finish() {
  TQKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(decode_));
  TQKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
  return Status::Ok();
}

double CudaRestoreDevice::copy_seconds() const {
  double s = 0;
  for (const auto& p : copy_times_) s += Elapsed(p.first, p.second) / 1e3;
  return s;
}

double CudaRestoreDevice::decode_seconds() const {
  double s = 0;
  for (const auto& p : decode_times_) s += Elapsed(p.first, p.second) / 1e3;
  return s;
}

double CudaRestoreDevice::first_layer_seconds() const {
  if (c_.layer_events->empty() || start_ == nullptr) return 0;
  return Elapsed(start_, c_.layer_events->front()) / 1e3;
}

}  // namespace tqkv::gpu
