// llama.cpp sequence states through the library in process (include/tqkv/llama_state.h): a blob
// (and a slot file's tokens) to a session of any store and back. The GIL is released while the
// library works.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "tqkv/llama_state.h"
#include "tqkv/settings.h"

namespace tqkv::python {
namespace {

nb::dict SaveState(PyStore& ps, const std::string& key, nb::bytes state, uint32_t head_dim,
                   const std::string& model, std::optional<std::vector<int32_t>> tokens,
                   const CheckpointSettings& settings) {
  const auto* p = static_cast<const uint8_t*>(state.data());
  const std::vector<uint8_t> blob(p, p + state.size());
  CheckpointOptions opts = ValueOrThrow(ResolveCheckpointOptions(settings));
  auto pool = Pool();
  opts.pool = pool.get();
  Result<CheckpointStats> stats = Status::Internal("unset");
  {
    nb::gil_scoped_release release;
    stats = llama::CheckpointSeqState(blob, head_dim, model, tokens ? &*tokens : nullptr, opts,
                                      *ps.store, key);
  }
  nb::dict d = CheckpointStatsDict(ValueOrThrow(std::move(stats)), DescribeSettings(settings, opts));
  d["state_bytes"] = blob.size();
  return d;
}

// (blob, tokens): tokens is None for a session saved from a bare blob.
nb::tuple LoadState(PyStore& ps, const std::string& key) {
  RestoreOptions opts;
  auto pool = Pool();
  opts.pool = pool.get();
  Result<llama::Rebuilt> r = Status::Internal("unset");
  {
    nb::gil_scoped_release release;
    r = llama::RestoreSeqState(*ps.store, key, opts);
  }
  llama::Rebuilt rebuilt = ValueOrThrow(std::move(r));
  nb::bytes blob(reinterpret_cast<const char*>(rebuilt.blob.data()), rebuilt.blob.size());
  if (!rebuilt.has_tokens) return nb::make_tuple(blob, nb::none());
  return nb::make_tuple(blob, rebuilt.tokens);
}

// A slot file's (tokens, state) or a bare blob's (None, state), split by the library.
nb::tuple SplitSlotFile(nb::bytes data) {
  const auto* p = static_cast<const uint8_t*>(data.data());
  llama::SlotOrBlob in =
      ValueOrThrow(llama::ParseSlotFileOrBlob(std::vector<uint8_t>(p, p + data.size())));
  nb::bytes state(reinterpret_cast<const char*>(in.slot.state.data()), in.slot.state.size());
  if (!in.is_slot) return nb::make_tuple(nb::none(), state);
  return nb::make_tuple(in.slot.tokens, state);
}

nb::bytes JoinSlotFile(const std::vector<int32_t>& tokens, nb::bytes state) {
  const auto* p = static_cast<const uint8_t*>(state.data());
  const std::vector<uint8_t> out =
      llama::SerializeSlotFile({tokens, std::vector<uint8_t>(p, p + state.size())});
  return nb::bytes(reinterpret_cast<const char*>(out.data()), out.size());
}

}  // namespace

void BindLlama(nb::module_& m) {
  m.def("llama_save", &SaveState, nb::arg("store"), nb::arg("key"), nb::arg("state"),
        nb::arg("head_dim"), nb::arg("model"), nb::arg("tokens").none(), nb::arg("settings"));
  m.def("llama_load", &LoadState, nb::arg("store"), nb::arg("key"));
  m.def("llama_split_slot_file", &SplitSlotFile, nb::arg("data"));
  m.def("llama_join_slot_file", &JoinSlotFile, nb::arg("tokens"), nb::arg("state"));
}

}  // namespace tqkv::python
