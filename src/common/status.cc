#include "tqkv/status.h"

#include <cerrno>
#include <cstring>

namespace tqkv {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "Invalid argument";
    case StatusCode::kNotFound: return "Not found";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kNoSpace: return "No space";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kDeviceError: return "Device error";
    case StatusCode::kBusy: return "Busy";
    case StatusCode::kAlreadyExists: return "Already exists";
    case StatusCode::kInternal: return "Internal error";
    case StatusCode::kResourceExhausted: return "Resource exhausted";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message)});
  }
}

Status Status::FromErrno(std::string_view what, std::string_view object, int err) {
  std::string msg;
  msg.append(what).append(" ").append(object).append(": ").append(std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT: return NoSpace(std::move(msg));
    case ENOENT: return NotFound(std::move(msg));
    case EEXIST: return AlreadyExists(std::move(msg));
    case EINVAL: return InvalidArgument(std::move(msg));
    case ENOMEM: return ResourceExhausted(std::move(msg));
    case EAGAIN:
    case EBUSY: return Busy(std::move(msg));
    default: return IoError(std::move(msg));
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(state_->code));
  if (!state_->message.empty()) s.append(": ").append(state_->message);
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg.append(": ").append(state_->message);
  return Status(state_->code, std::move(msg));
}

}  // namespace tqkv
