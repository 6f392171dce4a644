// The publish state machine every backend's writer shares (the WritableObject contract of
// tqkv/object.h), so a backend implements only the steps:
//
//   open --Append ok--> open --Commit: Publish ok--> committed
//     |  Append error -> failed --Commit--> Discard, aborted (the first error is returned)
//     |  Publish error -> Discard, aborted
//     +--Abort (open or failed)--> Discard, aborted
//   SimulateCrash: Stop (drop handles, no cleanup) -> crashed; every later call is IoError.
// After commit or abort, Append/Commit/Abort return InvalidArgument. A writer destroyed while
// open or failed is discarded.
#ifndef TQKV_SRC_STORE_PUBLISHING_WRITER_H_
#define TQKV_SRC_STORE_PUBLISHING_WRITER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "store/store_internal.h"
#include "tqkv/object.h"
#include "tqkv/status.h"

namespace tqkv::store_internal {

class PublishingWriter : public WritableObject, public Crashable {
 public:
  Status Append(std::span<const uint8_t> src) final;
  Status Commit() final;
  Status Abort() final;
  void SimulateCrash() final;

 protected:
  // `backend` names the store in messages ("posix", "nfs", ...).
  PublishingWriter(std::string_view backend, std::string key)
      : backend_(backend), key_(std::move(key)) {}
  // The derived destructor calls this first: by the time ~PublishingWriter runs, the derived
  // object (and its Discard) is gone.
  void DiscardIfUnfinished();
  const std::string& key() const { return key_; }

  // The steps; each is called only while the writer is open (Discard: open or failed).
  virtual Status AppendBytes(std::span<const uint8_t> src) = 0;
  // Flushes what is staged, makes it durable and publishes it atomically under the key.
  virtual Status Publish() = 0;
  // Removes what was written; must tolerate a partly published or already discarded writer.
  virtual Status Discard() = 0;
  // A crash: drop handles and buffers, leave everything written where it is.
  virtual void Stop() = 0;

 private:
  enum class State { kOpen, kFailed, kCommitted, kAborted, kCrashed };

  Status Finished(std::string_view what) const;

  std::string_view backend_;
  std::string key_;
  State state_ = State::kOpen;
  Status error_;  // the first error of a failed writer
};

}  // namespace tqkv::store_internal

#endif  // TQKV_SRC_STORE_PUBLISHING_WRITER_H_
