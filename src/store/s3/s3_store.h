// The S3 store: "s3://BUCKET/PREFIX?endpoint=http://host:port&region=us-east-1" against any
// S3-compatible server (AWS S3, MinIO, Ceph RGW, SeaweedFS, ...), through libcurl with SigV4.
//
// Names inside the bucket follow the file stores' layout (store/file_layout.h) under PREFIX:
//   PREFIX/a/b.tqkv              object "a/b" (one S3 object)
//   PREFIX/a/.b.tqkv.pin         pin: expiry in ns as text, -1 forever (store_admin.h)
//   PREFIX/a/.b.tqkv.access      last restore (Open) time in ns as text, written by Open
// A writer sends parts of a multipart upload while the caller keeps appending (at most `depth`
// parts in flight); the object appears only when CompleteMultipartUpload returns (objects
// smaller than one part go up in one PUT). An unfinished upload is invisible; Abort/discard
// aborts it, and gc (RemoveStaleTemps) aborts uploads older than its minimum age. Readers pin
// the ETag seen at Open (If-Match), so bytes of two versions are never mixed. docs/store.md.
#ifndef TQKV_SRC_STORE_S3_S3_STORE_H_
#define TQKV_SRC_STORE_S3_S3_STORE_H_

#include <memory>

#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

// The "s3" scheme of OpenStore. Credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN; AWS_REGION and AWS_ENDPOINT_URL when the URI gives no region / endpoint.
Result<std::unique_ptr<Store>> OpenS3StoreFromUri(const StoreUri& uri);

}  // namespace tqkv

#endif  // TQKV_SRC_STORE_S3_S3_STORE_H_
