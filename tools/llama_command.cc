// `tqkv llama import|export|inspect`: llama.cpp sequence states and llama-server slot files
// to and from .tqkv sessions (docs/llama.md).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_files.h"
#include "tools/commands.h"
#include "tools/file_object.h"
#include "tqkv/llama_state.h"
#include "tqkv/thread_pool.h"

namespace tqkv::tools {
namespace {

using json = nlohmann::json;

// --store/--session, or a .tqkv path.
struct Target {
  std::string store, session, path;
  void Add(CLI::App* cmd, const char* path_help) {
    cmd->add_option("--store", store, kStoreUriHelp);
    cmd->add_option("--session", session, "Session id (the object key) in --store");
    cmd->add_option("TQKV", path, path_help);
  }
  Result<StoreAndKey> Open(bool create) const {
    if (!store.empty()) {
      if (session.empty()) return Status::InvalidArgument("--store needs --session");
      if (!path.empty()) return Status::InvalidArgument("give --store/--session or a path, not both");
      TQKV_ASSIGN_OR_RETURN(auto s, OpenStore(store));
      return StoreAndKey{std::move(s), session};
    }
    if (path.empty()) return Status::InvalidArgument("give a .tqkv path or --store and --session");
    return OpenFilePath(path, create);
  }
};

json Layout(const llama::SeqState& st) {
  json caches = json::array();
  for (const auto& c : st.caches) {
    json streams = json::array();
    for (const auto& s : c.streams) {
      json layers = json::array();
      for (const auto& l : s.layers) {
        layers.push_back({{"k_type", llama::GgmlTypeName(l.k_type)},
                          {"v_type", llama::GgmlTypeName(l.v_type)},
                          {"n_embd_k", l.n_embd_k},
                          {"n_embd_v", l.n_embd_v}});
      }
      json stream = {{"cells", s.cells.size()}};
      if (!s.cells.empty()) {
        stream["v_trans"] = s.v_trans;
        stream["pos_first"] = s.cells.front().pos;
        stream["pos_last"] = s.cells.back().pos;
        stream["layers"] = layers;
      }
      streams.push_back(stream);
    }
    caches.push_back({{"streams", streams}});
  }
  return {{"cell_ext", st.cell_ext}, {"caches", caches}};
}

void RegisterImport(CLI::App* llama) {
  auto* cmd = llama->add_subcommand(
      "import", "Compress a llama.cpp slot file (ggsq) or sequence state blob into a session");
  struct Opts {
    std::string in, model = "llama.cpp";
    SettingsFlags settings;
    bool json = false;
    uint32_t head_dim = 0;
    size_t threads = 0;
    Target target;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("IN", o->in, "Slot file (llama-server --slot-save-path) or state blob")->required();
  o->settings.Add(cmd);
  cmd->add_flag("--json", o->json, "Print the figures and the settings as resolved as JSON");
  o->target.Add(cmd, "Output .tqkv (or --store and --session)");
  cmd->add_option("--head-dim", o->head_dim, "The model's head dimension (K/V rows split into heads of it)")
      ->required();
  cmd->add_option("--model", o->model, "Model name stored in the header")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Encode threads (0: all cores)")
      ->check(CountIn(0, ThreadPool::kMaxThreads));
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(std::vector<uint8_t> file, ReadInputFile(o->in));
      TQKV_ASSIGN_OR_RETURN(llama::SlotOrBlob in, llama::ParseSlotFileOrBlob(std::move(file)));
      const bool is_slot = in.is_slot;
      const llama::SlotFile& slot = in.slot;
      TQKV_ASSIGN_OR_RETURN(CheckpointOptions opts, o->settings.Resolve());
      ThreadPool pool(o->threads);
      opts.pool = &pool;
      TQKV_ASSIGN_OR_RETURN(StoreAndKey sk, o->target.Open(true));
      TQKV_ASSIGN_OR_RETURN(
          CheckpointStats st,
          llama::CheckpointSeqState(slot.state, o->head_dim, o->model,
                                    is_slot ? &slot.tokens : nullptr, opts, *sk.store, sk.key));
      if (o->json) {
        std::cout << json{{"session", sk.key},
                          {"slot_file", is_slot},
                          {"state_bytes", slot.state.size()},
                          {"bytes_written", st.bytes_written},
                          {"seconds", st.seconds},
                          {"guard_exceeded", st.guard_exceeded},
                          {"settings", o->settings.Json(opts)}}
                  << "\n";
        return Status::Ok();
      }
      std::printf("%s: %s %.1f MB -> %.1f MB (%s, %.2fx) in %.3f s\n", sk.key.c_str(),
                  is_slot ? "slot file" : "state", slot.state.size() / 1e6, st.bytes_written / 1e6,
                  o->settings.codec().c_str(), static_cast<double>(slot.state.size()) / st.bytes_written,
                  st.seconds);
      PrintGuardReport(st, opts);
      return Status::Ok();
    }();
    Report("llama import", s);
  });
}

void RegisterExport(CLI::App* llama) {
  auto* cmd = llama->add_subcommand(
      "export", "Rebuild the llama.cpp slot file (or state blob) of a session");
  struct Opts {
    std::string out;
    bool blob = false;
    size_t threads = 0;
    Target target;
  };
  auto o = std::make_shared<Opts>();
  o->target.Add(cmd, "Input .tqkv (or --store and --session)");
  cmd->add_option("--out", o->out, "Output slot file (or blob with --blob)")->required();
  cmd->add_flag("--blob", o->blob, "Write the bare sequence state even when the session has tokens");
  cmd->add_option("--threads", o->threads, "Decode threads (0: all cores)")
      ->check(CountIn(0, ThreadPool::kMaxThreads));
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(StoreAndKey sk, o->target.Open(false));
      const std::vector<std::string> inputs = {o->target.path};
      TQKV_RETURN_IF_ERROR(CheckOutputPath(o->out, inputs));
      ThreadPool pool(o->threads);
      RestoreOptions opts;
      opts.pool = &pool;
      TQKV_ASSIGN_OR_RETURN(llama::Rebuilt r, llama::RestoreSeqState(*sk.store, sk.key, opts));
      if (r.has_tokens && !o->blob) {
        r.blob = llama::SerializeSlotFile({r.tokens, std::move(r.blob)});
      }
      return WriteOutputFile(
          o->out, {reinterpret_cast<const char*>(r.blob.data()), r.blob.size()}, inputs);
    }();
    Report("llama export", s);
  });
}

void RegisterInspect(CLI::App* llama) {
  auto* cmd = llama->add_subcommand(
      "inspect", "Parse a slot file or state blob; print its layout and whether it re-serializes "
                 "byte for byte (JSON)");
  auto in = std::make_shared<std::string>();
  cmd->add_option("IN", *in, "Slot file or state blob")->required();
  cmd->callback([in] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(std::vector<uint8_t> file, ReadInputFile(*in));
      TQKV_ASSIGN_OR_RETURN(llama::SlotOrBlob parsed, llama::ParseSlotFileOrBlob(file));
      const bool is_slot = parsed.is_slot;
      const llama::SlotFile& slot = parsed.slot;
      TQKV_ASSIGN_OR_RETURN(llama::SeqState st, llama::ParseSeqState(slot.state));
      std::vector<uint8_t> again = llama::SerializeSeqState(st);
      if (is_slot) again = llama::SerializeSlotFile({slot.tokens, std::move(again)});
      json j = Layout(st);
      j["slot_file"] = is_slot;
      j["tokens"] = slot.tokens.size();
      j["bytes"] = file.size();
      j["reserializes_identically"] = again == file;
      std::cout << j.dump(2) << "\n";
      return Status::Ok();
    }();
    Report("llama inspect", s);
  });
}

}  // namespace

void RegisterLlamaCommands(CLI::App& app) {
  auto* llama = app.add_subcommand("llama", "llama.cpp sequence states and slot files (docs/llama.md)");
  llama->require_subcommand(1);
  RegisterImport(llama);
  RegisterExport(llama);
  RegisterInspect(llama);
}

}  // namespace tqkv::tools
