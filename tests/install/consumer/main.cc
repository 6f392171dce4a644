// Checkpoints and restores a tiny session through the installed library's public headers.
#include <tqkv/checkpoint.h>
#include <tqkv/settings.h>
#include <tqkv/memory_store.h>

#include <cstdio>
#include <cstring>

int main() {
  tqkv::ModelGeometry g{2, 2, 64};
  auto buf = tqkv::KvCacheBuffer::Allocate("consumer", g, tqkv::DType::kF16, 32);
  if (!buf.ok()) return 1;
  for (uint32_t l = 0; l < g.layers; ++l) {
    auto* k = static_cast<uint16_t*>(buf.value()->cache().k(l));
    auto* v = static_cast<uint16_t*>(buf.value()->cache().v(l));
    for (size_t i = 0; i < 32 * g.token_elems(); ++i) {
      k[i] = tqkv::FloatToHalf(static_cast<float>(i % 17) - 8.0f);
      v[i] = tqkv::FloatToHalf(static_cast<float>(i % 5));
    }
  }
  tqkv::MemoryStore store;
  // As README.md shows it: unset settings take the library's defaults.
  auto resolved = tqkv::ResolveCheckpointOptions({.exact_tokens = "4,8"});
  if (!resolved.ok()) return 1;
  tqkv::CheckpointOptions opts = resolved.value();
  auto st = tqkv::Checkpoint(buf.value()->cache(), opts, store, "s");
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.status().ToString().c_str());
    return 1;
  }
  auto restored = tqkv::Restore(store, "s", {});
  if (!restored.ok()) return 1;
  std::printf("consumer: %llu bytes, restored %llu tokens\n",
              static_cast<unsigned long long>(st->bytes_written),
              static_cast<unsigned long long>(restored.value()->cache().tokens()));
  return 0;
}
