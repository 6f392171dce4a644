// The writer publish state machine (publishing_writer.h).
#include "store/publishing_writer.h"

namespace tqkv::store_internal {

Status PublishingWriter::Finished(std::string_view what) const {
  if (state_ == State::kCrashed) {
    return Status::IoError(std::string(backend_) + " writer of " + key_ + " crashed");
  }
  return Status::InvalidArgument(std::string(what) + " " + std::string(backend_) + " object " +
                                 key_ + " after it was committed or aborted");
}

Status PublishingWriter::Append(std::span<const uint8_t> src) {
  if (state_ == State::kFailed) return error_;
  if (state_ != State::kOpen) return Finished("append to");
  Status s = AppendBytes(src);
  if (!s.ok()) {
    error_ = s;
    state_ = State::kFailed;
  }
  return s;
}

Status PublishingWriter::Commit() {
  if (state_ == State::kFailed) {
    (void)Discard();  // the first error is the one to report
    state_ = State::kAborted;
    return error_;
  }
  if (state_ != State::kOpen) return Finished("commit");
  Status s = Publish();
  if (!s.ok()) {
    (void)Discard();
    state_ = State::kAborted;
    return s;
  }
  state_ = State::kCommitted;
  return Status::Ok();
}

Status PublishingWriter::Abort() {
  if (state_ != State::kOpen && state_ != State::kFailed) return Finished("abort");
  state_ = State::kAborted;
  return Discard();
}

void PublishingWriter::SimulateCrash() {
  if (state_ == State::kCommitted || state_ == State::kAborted) return;
  Stop();
  state_ = State::kCrashed;
}

void PublishingWriter::DiscardIfUnfinished() {
  if (state_ != State::kOpen && state_ != State::kFailed) return;
  state_ = State::kAborted;
  (void)Discard();
}

}  // namespace tqkv::store_internal
