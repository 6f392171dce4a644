// The default of ReadableObject::ReadBatch (tqkv/object.h).
#include "tqkv/object.h"

namespace tqkv {

Status ReadableObject::ReadBatch(std::span<const ReadRequest> reqs) {
  for (const ReadRequest& r : reqs) {
    TQKV_RETURN_IF_ERROR(ReadAt(r.offset, r.dst));
  }
  return Status::Ok();
}

}  // namespace tqkv
