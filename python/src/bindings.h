// Shared by the binding files: Status -> Python exceptions, arrays -> element types, the pool.
#ifndef TQKV_PYTHON_SRC_BINDINGS_H_
#define TQKV_PYTHON_SRC_BINDINGS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "tqkv/status.h"
#include "tqkv/store.h"
#include "tqkv/thread_pool.h"
#include "tqkv/types.h"

namespace tqkv {
struct LayoutTensors;       // kv_layout.h
struct BatchObject;         // batch.h
struct BatchStats;          // batch.h
struct RestoreStats;        // checkpoint.h
struct CheckpointStats;     // checkpoint.h
struct CheckpointSettings;  // settings.h
struct ResolvedSettings;    // settings.h
}  // namespace tqkv

namespace tqkv::python {

namespace nb = nanobind;

// Carries a non-OK Status to the exception translator (module.cc), which raises the
// tqkv.Error subclass of its code with its message.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status s) : std::runtime_error(s.message()), status_(std::move(s)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

inline void ThrowIfError(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T ValueOrThrow(Result<T> r) {
  if (!r.ok()) throw StatusError(r.status());
  return std::move(r).value();
}
[[noreturn]] inline void ThrowInvalid(std::string message) {
  throw StatusError(Status::InvalidArgument(std::move(message)));
}

// float32, float16, bfloat16 (torch), or uint16 holding bfloat16 bit patterns (numpy, whose
// ml_dtypes.bfloat16 the Python layer views as uint16). InvalidArgument otherwise.
DType ArrayDType(const nb::dlpack::dtype& t, const char* what);

// Element offsets: n vectors of `dim` elements whose last axis is contiguous and whose leading
// axes collapse to one stride (C order, rows possibly padded). InvalidArgument otherwise.
struct Rows {
  size_t n = 0;
  size_t stride = 0;  // elements between vectors
};
template <typename Array>
Rows RowsOf(const Array& a, size_t dim, const char* what) {
  const size_t nd = a.ndim();
  if (nd == 0 || a.shape(nd - 1) != dim) {
    ThrowInvalid(std::string(what) + ": the last axis must have " + std::to_string(dim) +
                 " elements" + (nd ? ", not " + std::to_string(a.shape(nd - 1)) : std::string()));
  }
  if (dim > 1 && a.stride(nd - 1) != 1) ThrowInvalid(std::string(what) + ": the last axis must be contiguous");
  Rows r{1, dim};
  if (nd == 1) return r;
  for (size_t i = 0; i + 1 < nd; ++i) r.n *= a.shape(i);
  if (a.shape(nd - 2) > 1) {
    if (a.stride(nd - 2) < static_cast<int64_t>(dim)) {
      ThrowInvalid(std::string(what) + ": rows overlap (row stride below the vector length)");
    }
    r.stride = static_cast<size_t>(a.stride(nd - 2));
  }
  // Leading axes must collapse onto the row axis (C order).
  int64_t expect = static_cast<int64_t>(r.stride) * static_cast<int64_t>(a.shape(nd - 2));
  for (size_t i = nd - 2; i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expect) {
      ThrowInvalid(std::string(what) + ": the leading axes must be C-contiguous "
                   "(numpy.ascontiguousarray / tensor.contiguous())");
    }
    expect *= static_cast<int64_t>(a.shape(i));
  }
  return r;
}

// The process-wide decode/encode pool (set_num_threads); shared_ptr so a call in flight keeps
// the pool it started with.
std::shared_ptr<ThreadPool> Pool();

// A Python handle on a store.
struct PyStore {
  std::unique_ptr<Store> store;
};

// What CUDA arrays and device="cuda" get from a build without CUDA.
inline constexpr const char* kNoCudaMessage =
    "CUDA arrays need the CUDA build of tqkv (tqkv.CUDA is False here): "
    "pip install . --config-settings=cmake.define.TQKV_ENABLE_CUDA=ON, or pass CPU arrays";

// Restores `key` into CUDA arrays `dst` (pointers on `device`, their layout as for CPU arrays)
// through the library's GPU restore, decoding straight into them (gpu_bindings.cc); layer_ready(l)
// once layer l is decoded. InvalidArgument (kNoCudaMessage) without the CUDA build.
Status RestoreToCudaArrays(Store& store, const std::string& key, const LayoutTensors& dst,
                           int device, const std::function<Status(uint32_t)>& layer_ready,
                           RestoreStats* stats);

// RestoreBatch into CUDA arrays through the library's GPU batch restore (gpu_bindings.cc);
// layer_ready(l) once layer l of every object is decoded. InvalidArgument without CUDA.
Status RestoreBatchToCudaArrays(Store& store, std::span<const BatchObject> objects,
                                const LayoutTensors& dst, int device,
                                const std::function<Status(uint32_t)>& layer_ready,
                                BatchStats* stats);

// What checkpoint() and tqkv.llama's save return (session_bindings.cc): sizes, times, the
// guard's figures and the settings as resolved.
nb::dict CheckpointStatsDict(const CheckpointStats& s, const ResolvedSettings& settings);

void BindCodec(nb::module_& m);
void BindLlama(nb::module_& m);
void BindStore(nb::module_& m);
void BindSession(nb::module_& m);

}  // namespace tqkv::python

#endif  // TQKV_PYTHON_SRC_BINDINGS_H_
