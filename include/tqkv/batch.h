// Batches of stored sessions moved between a store and one engine's paged KV memory in one call:
// a prompt kept as a chain of chunks (tqkv.vllm stores one session per chunk), restored into the
// blocks the engine allocated for it or checkpointed from them. Several objects move at once on
// the library's threads, so some objects' reads overlap others' decoding, and a restore reports
// each layer once for the whole batch.
#ifndef TQKV_INCLUDE_TQKV_BATCH_H_
#define TQKV_INCLUDE_TQKV_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tqkv/checkpoint.h"
#include "tqkv/kv_layout.h"
#include "tqkv/status.h"
#include "tqkv/store.h"

namespace tqkv {

struct BatchObject {
  std::string key;
  std::vector<int64_t> block_ids;  // the paged tensors' blocks holding its tokens, in order
  std::string model;               // restore: the header's model must equal it (empty: any);
                                   // checkpoint: stored in the header
  uint64_t first_token = 0;        // checkpoint: its first token's position in the prompt
  // Its tokens, in its first blocks (0: the destination's tokens): a prompt's last, shorter
  // chunk. A restore checks the stored count against it.
  uint64_t tokens = 0;
};

struct BatchOptions {
  // Objects read and decoded (or encoded and written) at once; each also reads ahead within
  // itself. 4 keep a disk or a link busy while two cores decode (docs/lab/vllm.md).
  size_t objects_in_flight = 4;
  bool skip_existing = true;  // checkpoint: an object already in the store is left as it is
};

struct BatchStats {
  size_t done = 0;     // objects [0, done) were restored or stored (or found stored)
  size_t skipped = 0;  // checkpoint: of those, already in the store
  uint64_t bytes = 0;  // read (restore) or written (checkpoint) for those objects
  uint64_t fp16_bytes = 0;
  uint64_t tokens = 0;
  double seconds = 0;              // wall time of the call
  double first_layer_seconds = 0;  // restore: until layer 0 of every object was in place
};

// Restores objects[i] into the blocks objects[i].block_ids of `dst`, a paged destination
// (dst.tokens: the tokens of an object whose own count is 0; the block ids in dst's layouts are
// not used). Each
// object's header (model, geometry, tokens) is checked before a byte of its blocks is written.
// options.layer_ready(l) is called once per layer, in order, as soon as layer l of every object
// is in place (objects that failed are not waited for). A failed object fails itself and every
// later one: the first failure is returned (naming the object) and stats->done says how many
// objects before it were restored, whose blocks hold their tokens; later blocks hold anything.
Status RestoreBatch(Store& store, std::span<const BatchObject> objects, const LayoutTensors& dst,
                    const RestoreOptions& options, const BatchOptions& batch = {},
                    BatchStats* stats = nullptr);

// Checkpoints each object's tokens from the paged tensors `src` (its tokens, else src.tokens) under its
// key, each published atomically. The object's exact rows are the prompt's first
// options.exact_head tokens that it holds (first_token); options.exact_tail must be 0, since a
// prompt's last tokens change every turn. Failures as for RestoreBatch: objects [0, done) are
// stored; a later one that was in flight when an earlier one failed may have been published too.
Status CheckpointBatch(Store& store, std::span<const BatchObject> objects,
                       const LayoutTensors& src, const CheckpointOptions& options,
                       const BatchOptions& batch = {}, BatchStats* stats = nullptr);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_BATCH_H_
