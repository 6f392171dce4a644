// libFuzzer target for the llama.cpp sequence-state and slot-file readers (include/tqkv/llama_state.h).
//
// Every input is tried as a get_data blob and as a slot file. What parses must serialize back to
// the same bytes (the reader accepts only what it can rewrite exactly), turn into a session
// (ToSession, head_dim 64) or be refused as bad data, and a session must rebuild the very same
// blob (FromSession; only f32/f16/bf16 rows are accepted, so the round trip is lossless), with
// the session's memory within a bound of the input's size. Seeds: fuzz/corpus/llama_state
// (SmolLM2-135M and Gemma 3 270M through llama-cpp-python 0.3.36, 2 tokens; flash attention off
// (v_trans) and on; get_data blobs and slot files) and regress-*: inputs that once failed.
// Build: -DTQKV_BUILD_FUZZERS=ON with clang; run:
//   mkdir -p /tmp/lf && ./build-fuzz/llama_state_fuzz -max_total_time=60 -timeout=10 \
//       -rss_limit_mb=2048 -max_len=65536 /tmp/lf fuzz/corpus/llama_state
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "tqkv/llama_state.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "llama_state_fuzz: %s\n", what);
    std::abort();
  }
}

bool BadData(const tqkv::Status& s) {
  return s.code() == tqkv::StatusCode::kCorruption || s.code() == tqkv::StatusCode::kUnsupported ||
         s.code() == tqkv::StatusCode::kInvalidArgument ||
         s.code() == tqkv::StatusCode::kResourceExhausted;
}

void TryBlob(std::span<const uint8_t> blob, const std::vector<int32_t>* tokens) {
  auto state = tqkv::llama::ParseSeqState(blob);
  if (!state.ok()) {
    Check(BadData(state.status()), "ParseSeqState: an error that is not about the data");
    return;
  }
  const std::vector<uint8_t> again = tqkv::llama::SerializeSeqState(*state);
  Check(std::vector<uint8_t>(blob.begin(), blob.end()) == again, "parse -> serialize differs");
  auto session = tqkv::llama::ToSession(*state, 64, "fuzz", tokens);
  if (!session.ok()) {
    Check(BadData(session.status()), "ToSession: an error that is not about the data");
    return;
  }
  const tqkv::KvCache& kv = session->kv->cache();
  // Rows are the blob's cells (at most one per 4 bytes of it), at most f32 each way.
  Check(kv.tokens() <= blob.size() / 4 + 1, "more session rows than the blob can hold");
  // Each layer holds only its stream's rows (ragged layers, no padding): the session's K and V
  // are the blob's, at most doubled (f16 rows of a mixed blob held as f32).
  uint64_t held = 0;
  for (uint32_t l = 0; l < kv.geometry().layers; ++l) held += 2 * uint64_t{kv.tensor_bytes(l)};
  Check(held <= 2 * uint64_t{blob.size()}, "session memory beyond twice the blob");
  auto rebuilt = tqkv::llama::FromSession(kv, session->engine_state);
  Check(rebuilt.ok(), "FromSession refused its own session");
  Check(rebuilt->blob == again, "session -> blob differs");
  Check(rebuilt->has_tokens == (tokens != nullptr), "tokens lost");
  if (tokens != nullptr) Check(rebuilt->tokens == *tokens, "tokens differ");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  TryBlob(in, nullptr);
  auto slot = tqkv::llama::ParseSlotFile(in);
  if (!slot.ok()) {
    Check(BadData(slot.status()), "ParseSlotFile: an error that is not about the data");
    return 0;
  }
  Check(tqkv::llama::SerializeSlotFile(*slot) == std::vector<uint8_t>(in.begin(), in.end()),
        "slot file parse -> serialize differs");
  TryBlob(slot->state, &slot->tokens);
  return 0;
}
