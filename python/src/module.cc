// tqkv._tqkv: the extension module. Exceptions mapped from StatusCode, the thread pool, and the
// bindings of codec_bindings.cc, store_bindings.cc and session_bindings.cc.
#include <mutex>
#include <thread>

#include "bindings.h"
#include "tqkv/checkpoint.h"

namespace tqkv::python {
namespace {

std::mutex pool_mu;
std::shared_ptr<ThreadPool> pool;

struct ErrorType {
  StatusCode code;
  const char* name;     // attribute of the module
  const char* extra;    // a builtin base besides tqkv.Error, or null
  const char* doc;
  PyObject* type = nullptr;
};

PyObject* error_base = nullptr;
ErrorType error_types[] = {
    {StatusCode::kInvalidArgument, "InvalidArgumentError", "ValueError",
     "A bad argument: spec, shape, dtype, geometry of out=, key, URI or option."},
    {StatusCode::kNotFound, "NotFoundError", "LookupError", "No such session, store or file."},
    {StatusCode::kCorruption, "CorruptionError", nullptr,
     "Stored bytes failed a check (checksum, size, magic): the object is damaged or not a .tqkv."},
    {StatusCode::kIoError, "IoError", "OSError", "The store's I/O failed."},
    {StatusCode::kNoSpace, "NoSpaceError", "OSError", "The store is full."},
    {StatusCode::kUnsupported, "UnsupportedError", nullptr,
     "Not supported by this store, build or format version."},
    {StatusCode::kDeviceError, "DeviceError", nullptr, "A CUDA or cuFile call failed."},
    {StatusCode::kBusy, "BusyError", nullptr, "The object changed meanwhile (e.g. gc raced a writer)."},
    {StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr, "The name is taken."},
    {StatusCode::kInternal, "InternalError", nullptr, "A bug in tqkv: please report it."},
    {StatusCode::kResourceExhausted, "ResourceExhaustedError", "MemoryError",
     "A size that does not fit, or memory the system will not give."},
};
// Every StatusCode has its exception (a new code needs a row above).
static_assert(static_cast<int>(StatusCode::kResourceExhausted) == 11);

void MakeErrors(nb::module_& m) {
  error_base = PyErr_NewExceptionWithDoc(
      "tqkv.Error",
      "Base of every tqkv error. `code` names the library's StatusCode; str() is its message.",
      PyExc_Exception, nullptr);
  PyObject_SetAttrString(error_base, "code", nb::str("Error").ptr());
  m.attr("Error") = nb::borrow(error_base);
  for (ErrorType& e : error_types) {
    nb::object bases;
    if (e.extra != nullptr) {
      bases = nb::make_tuple(nb::borrow(error_base), nb::module_::import_("builtins").attr(e.extra));
    } else {
      bases = nb::make_tuple(nb::borrow(error_base));
    }
    const std::string qualified = std::string("tqkv.") + e.name;
    e.type = PyErr_NewExceptionWithDoc(qualified.c_str(), e.doc, bases.ptr(), nullptr);
    const std::string_view code = StatusCodeName(e.code);
    PyObject_SetAttrString(e.type, "code", nb::str(code.data(), code.size()).ptr());
    m.attr(e.name) = nb::borrow(e.type);
  }
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& err) {
      PyObject* type = error_base;
      for (const ErrorType& e : error_types) {
        if (e.code == err.status().code()) type = e.type;
      }
      PyErr_SetString(type, err.status().message().c_str());
    }
  });
}

}  // namespace

std::shared_ptr<ThreadPool> Pool() {
  std::lock_guard<std::mutex> lock(pool_mu);
  if (!pool) pool = std::make_shared<ThreadPool>(0);
  return pool;
}

DType ArrayDType(const nb::dlpack::dtype& t, const char* what) {
  using Code = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == static_cast<uint8_t>(Code::Float) && t.bits == 32) return DType::kF32;
    if (t.code == static_cast<uint8_t>(Code::Float) && t.bits == 16) return DType::kF16;
    if (t.code == static_cast<uint8_t>(Code::Bfloat) && t.bits == 16) return DType::kBF16;
    if (t.code == static_cast<uint8_t>(Code::UInt) && t.bits == 16) return DType::kBF16;
  }
  ThrowInvalid(std::string(what) + ": element type must be float16, bfloat16 or float32");
}

}  // namespace tqkv::python

NB_MODULE(_tqkv, m) {
  namespace py = tqkv::python;
  namespace nb = nanobind;
  m.doc() = "tqkv's C++ core; use the tqkv package (tqkv/__init__.py), not this module.";
  py::MakeErrors(m);
  m.def(
      "set_num_threads",
      [](size_t n) {
        if (n > tqkv::ThreadPool::kMaxThreads) {  // as the CLI's --threads
          py::ThrowInvalid("set_num_threads: " + std::to_string(n) + " threads, at most " +
                           std::to_string(tqkv::ThreadPool::kMaxThreads));
        }
        auto fresh = std::make_shared<tqkv::ThreadPool>(n);
        std::lock_guard<std::mutex> lock(py::pool_mu);
        py::pool = std::move(fresh);
      },
      nb::arg("n"),
      "Sizes the pool that encodes and decodes (0: one thread per hardware thread, the "
      "default). Calls already running keep their pool.");
  m.def(
      "warm_restore_memory",
      [](size_t concurrent, uint64_t read_ahead) {
        tqkv::RestoreOptions o;
        o.inflight_bytes = read_ahead;
        auto kept = tqkv::WarmRestoreMemory(concurrent, o);
        py::ThrowIfError(kept.status());
        return *kept;
      },
      nb::arg("concurrent") = 1, nb::arg("read_ahead") = uint64_t{64} << 20,
      "Allocates, touches and keeps the read-ahead memory of `concurrent` restores (at most 2 GiB "
      "kept in all), so that the first restores do not pay for fresh memory. Returns the bytes "
      "kept.");
  m.def(
      "get_num_threads", [] { return py::Pool()->size(); },
      "Threads that encode and decode for each call (the calling thread included).");
  m.def(
      "built_with_cuda",
      [] {
#ifdef TQKV_HAVE_CUDA
        return true;
#else
        return false;
#endif
      },
      "True when the package was built with the CUDA library (TQKV_ENABLE_CUDA).");
  m.attr("NO_CUDA_MESSAGE") = py::kNoCudaMessage;
  py::BindCodec(m);
  py::BindStore(m);
  py::BindSession(m);
  py::BindLlama(m);
}
