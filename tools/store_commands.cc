// Session management on a store: `tqkv ls`, `tqkv rm`, `tqkv pin`, `tqkv gc` (tqkv/store_admin.h).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tqkv/store_admin.h"
#include "tools/commands.h"
#include "tqkv/store.h"
#include "tqkv/units.h"

namespace tqkv::tools {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A duration option (tqkv/units.h) in whole seconds, at least `min_s`.
Result<std::chrono::seconds> DurationOption(std::string_view option, const std::string& text,
                                            int64_t min_s) {
  auto d = ParseDuration(text, std::chrono::seconds(min_s));
  if (!d.ok()) return d.status().WithContext(std::string(option));
  return std::chrono::duration_cast<std::chrono::seconds>(*d);
}

std::string Iso(int64_t ns) {
  if (ns <= 0) return "-";
  const time_t t = static_cast<time_t>(ns / 1'000'000'000);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string PinText(const SessionMeta& m) {
  if (m.pin_until_ns == kPinForever) return "pinned";
  if (m.pin_until_ns > NowNs()) return "pinned until " + Iso(m.pin_until_ns);
  return "-";
}

nlohmann::json MetaJson(const SessionMeta& m) {
  return {{"session", m.key}, {"bytes", m.size}, {"published", Iso(m.mtime_ns)},
          {"last_access", Iso(m.LastUse())}, {"pinned", m.PinnedAt(NowNs())},
          {"pin_until", m.pin_until_ns == kPinForever ? "forever" : Iso(m.pin_until_ns)}};
}

void RegisterLs(CLI::App& app) {
  auto* cmd = app.add_subcommand("ls", "List the sessions of a store: size, publish and last-access time, pin");
  struct Opts {
    std::string store;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--store", o->store, kStoreUriHelp)
      ->required();
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(auto store, OpenExistingStore(o->store));
      TQKV_ASSIGN_OR_RETURN(auto admin, OpenSessionAdmin(store.get()));
      TQKV_ASSIGN_OR_RETURN(auto sessions, admin->ListSessions());
      uint64_t total = 0;
      for (const auto& m : sessions) total += m.size;
      if (o->json) {
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& m : sessions) arr.push_back(MetaJson(m));
        std::cout << nlohmann::json{{"store", store->Uri()}, {"bytes", total}, {"sessions", arr}}
                         .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                  << "\n";
        return Status::Ok();
      }
      std::printf("%-40s %14s  %-20s  %-20s  %s\n", "SESSION", "BYTES", "PUBLISHED", "LAST ACCESS", "PIN");
      for (const auto& m : sessions) {
        std::printf("%-40s %14llu  %-20s  %-20s  %s\n", m.key.c_str(),
                    static_cast<unsigned long long>(m.size), Iso(m.mtime_ns).c_str(),
                    Iso(m.LastUse()).c_str(), PinText(m).c_str());
      }
      std::printf("%zu sessions, %llu bytes\n", sessions.size(), static_cast<unsigned long long>(total));
      return Status::Ok();
    }();
    Report("ls", s);
  });
}

void RegisterRm(CLI::App& app) {
  auto* cmd = app.add_subcommand("rm", "Remove a session from a store (also its pin)");
  struct Opts {
    std::string store, session;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--store", o->store, kStoreUriHelp)->required();
  cmd->add_option("--session", o->session, "Session id")->required();
  cmd->callback([o] {
    Status s = [&]() -> Status {
      TQKV_ASSIGN_OR_RETURN(auto store, OpenExistingStore(o->store));
      TQKV_RETURN_IF_ERROR(store->Remove(o->session));
      if (auto admin = OpenSessionAdmin(store.get()); admin.ok()) {
        (void)(*admin)->SetPin(o->session, 0);
      }
      std::printf("removed %s\n", o->session.c_str());
      return Status::Ok();
    }();
    Report("rm", s);
  });
}

void RegisterPin(CLI::App& app) {
  auto* cmd = app.add_subcommand("pin", "Pin a session so gc never evicts it (for --ttl, or until --unpin)");
  struct Opts {
    std::string store, session, ttl;
    bool unpin = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--store", o->store, kStoreUriHelp)->required();
  cmd->add_option("--session", o->session, "Session id")->required();
  cmd->add_option("--ttl", o->ttl,
                  std::string("Pin for this long (default: until --unpin). ") + kDurationHelp);
  cmd->add_flag("--unpin", o->unpin, "Remove the pin");
  cmd->callback([o] {
    Status s = [&]() -> Status {
      if (o->unpin && !o->ttl.empty()) return Status::InvalidArgument("--ttl and --unpin exclude each other");
      TQKV_ASSIGN_OR_RETURN(auto store, OpenExistingStore(o->store));
      TQKV_ASSIGN_OR_RETURN(auto admin, OpenSessionAdmin(store.get()));
      int64_t until = kPinForever;
      if (o->unpin) {
        until = 0;
      } else if (!o->ttl.empty()) {
        TQKV_ASSIGN_OR_RETURN(auto ttl, DurationOption("--ttl", o->ttl, 1));
        until = NowNs() + static_cast<int64_t>(ttl.count()) * 1'000'000'000;  // <= 100 years
      }
      TQKV_RETURN_IF_ERROR(admin->SetPin(o->session, until));
      std::printf("%s %s%s\n", o->unpin ? "unpinned" : "pinned", o->session.c_str(),
                  until > 0 ? (" until " + Iso(until)).c_str() : "");
      return Status::Ok();
    }();
    Report("pin", s);
  });
}

void RegisterGc(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "gc", "Evict sessions over a capacity cap (least recently used first) or unused for a TTL; "
            "remove dead writers' temps. Pinned sessions stay.");
  struct Opts {
    std::string store, max_bytes, ttl, temp_age = "1h";
    bool dry_run = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--store", o->store, kStoreUriHelp)->required();
  cmd->add_option("--max-bytes", o->max_bytes,
                  std::string("Capacity cap for the store's sessions, at least 1 B (e.g. 50GB). ") +
                      kByteSizeHelp);
  cmd->add_option("--ttl", o->ttl,
                  std::string("Evict sessions not restored or written for this long (e.g. 24h). ") +
                      kDurationHelp);
  cmd->add_option("--temp-age", o->temp_age, "Remove temps of writers older than this")->capture_default_str();
  cmd->add_flag("--dry-run", o->dry_run, "Only print what would be removed");
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] {
    Status s = [&]() -> Status {
      // Every option is checked before the store is opened: a bad one changes nothing.
      GcOptions g;
      if (!o->max_bytes.empty()) {
        // At least 1 B: GcOptions reads 0 as "no cap"; to empty a store, rm its sessions.
        auto cap = ParseByteSize(o->max_bytes, 1);
        if (!cap.ok()) return cap.status().WithContext("--max-bytes (omit it for no cap)");
        g.max_bytes = *cap;
      }
      if (!o->ttl.empty()) {
        TQKV_ASSIGN_OR_RETURN(g.ttl, DurationOption("--ttl", o->ttl, 1));
      }
      TQKV_ASSIGN_OR_RETURN(g.temp_min_age, DurationOption("--temp-age", o->temp_age, 0));
      g.dry_run = o->dry_run;
      TQKV_ASSIGN_OR_RETURN(auto store, OpenExistingStore(o->store));
      TQKV_ASSIGN_OR_RETURN(GcReport r, CollectGarbage(store.get(), g));
      if (o->json) {
        nlohmann::json ex = nlohmann::json::array(), ev = nlohmann::json::array();
        for (const auto& m : r.expired) ex.push_back(MetaJson(m));
        for (const auto& m : r.evicted) ev.push_back(MetaJson(m));
        std::cout << nlohmann::json{{"dry_run", o->dry_run}, {"bytes_before", r.bytes_before},
                                    {"bytes_after", r.bytes_after}, {"expired", ex},
                                    {"evicted", ev}, {"pinned_kept", r.pinned_kept},
                                    {"temps_removed", r.temps_removed},
                                    {"over_cap_after", r.over_cap_after}}
                         .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                  << "\n";
        return Status::Ok();
      }
      const char* verb = o->dry_run ? "would remove" : "removed";
      for (const auto& m : r.expired) {
        std::printf("%s %s (%llu bytes): unused since %s\n", verb, m.key.c_str(),
                    static_cast<unsigned long long>(m.size), Iso(m.LastUse()).c_str());
      }
      for (const auto& m : r.evicted) {
        std::printf("%s %s (%llu bytes): over the cap, last used %s\n", verb, m.key.c_str(),
                    static_cast<unsigned long long>(m.size), Iso(m.LastUse()).c_str());
      }
      std::printf("%llu -> %llu bytes; %zu pinned kept; %llu stale temps %s%s\n",
                  static_cast<unsigned long long>(r.bytes_before),
                  static_cast<unsigned long long>(r.bytes_after), r.pinned_kept.size(),
                  static_cast<unsigned long long>(r.temps_removed),
                  o->dry_run ? "would be removed" : "removed",
                  r.over_cap_after ? "; still over the cap (pinned sessions)" : "");
      return Status::Ok();
    }();
    Report("gc", s);
  });
}

}  // namespace

void RegisterStoreCommands(CLI::App& app) {
  RegisterLs(app);
  RegisterRm(app);
  RegisterPin(app);
  RegisterGc(app);
}

}  // namespace tqkv::tools
