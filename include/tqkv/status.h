// Status and Result<T>: the error model of the public API. Nothing in tqkv throws across it.
#ifndef TQKV_INCLUDE_TQKV_STATUS_H_
#define TQKV_INCLUDE_TQKV_STATUS_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tqkv {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kCorruption,
  kIoError,
  kNoSpace,
  kUnsupported,
  kDeviceError,
  kBusy,
  kAlreadyExists,
  kInternal,
  kResourceExhausted,  // a size that does not fit, or memory the system will not give
};

std::string_view StatusCodeName(StatusCode code);

// Cheap when OK (no allocation); carries a code and a message otherwise.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status NoSpace(std::string msg) { return {StatusCode::kNoSpace, std::move(msg)}; }
  static Status Unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status DeviceError(std::string msg) { return {StatusCode::kDeviceError, std::move(msg)}; }
  static Status Busy(std::string msg) { return {StatusCode::kBusy, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  // An I/O error from errno, e.g. FromErrno("pread", path, errno): ENOSPC maps to kNoSpace.
  static Status FromErrno(std::string_view what, std::string_view object, int err);

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  std::string ToString() const;  // "Corruption: chunk 3 of s.tqkv at offset 8192: ..."

  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsCorruption() const { return code() == StatusCode::kCorruption; }
  bool IsNoSpace() const { return code() == StatusCode::kNoSpace; }
  bool IsResourceExhausted() const { return code() == StatusCode::kResourceExhausted; }

  // Returns a copy with "context: " prepended to the message (same code).
  Status WithContext(std::string_view context) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;
};

// A value or an error Status. Accessing value() of an error aborts (programmer error).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) {
      std::fprintf(stderr, "tqkv: Result constructed from an OK Status\n");
      std::abort();
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { Check(); return std::get<T>(v_); }
  const T& value() const& { Check(); return std::get<T>(v_); }
  T&& value() && { Check(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void Check() const {
    if (!ok()) {
      std::fprintf(stderr, "tqkv: value() of an error Result: %s\n",
                   std::get<Status>(v_).ToString().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> v_;
};

}  // namespace tqkv

#define TQKV_CONCAT_IMPL_(a, b) a##b
#define TQKV_CONCAT_(a, b) TQKV_CONCAT_IMPL_(a, b)

#define TQKV_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::tqkv::Status tqkv_status_ = (expr);       \
    if (!tqkv_status_.ok()) return tqkv_status_; \
  } while (0)

#define TQKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

// TQKV_ASSIGN_OR_RETURN(auto x, MakeX()); returns the error Status on failure.
#define TQKV_ASSIGN_OR_RETURN(lhs, expr) \
  TQKV_ASSIGN_OR_RETURN_IMPL_(TQKV_CONCAT_(tqkv_result_, __LINE__), lhs, expr)

// Programmer errors (violated preconditions inside the library): abort with file:line.
#define TQKV_CHECK(cond)                                                               \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "tqkv: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

#ifndef NDEBUG
#define TQKV_DCHECK(cond) TQKV_CHECK(cond)
#else
#define TQKV_DCHECK(cond) \
  do {                    \
  } while (0)
#endif

#endif  // TQKV_INCLUDE_TQKV_STATUS_H_
