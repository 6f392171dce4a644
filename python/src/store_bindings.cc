// tqkv._tqkv.Store: OpenStore (include/tqkv/store.h), session admin (tqkv/store_admin.h),
// container description and verification (tqkv/describe.h, tqkv/checkpoint.h).
#include <chrono>

#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "tqkv/checkpoint.h"
#include "tqkv/container.h"
#include "tqkv/describe.h"
#include "tqkv/store_admin.h"

namespace tqkv::python {
namespace {

nb::dict MetaDict(const SessionMeta& s) {
  nb::dict d;
  d["key"] = s.key;
  d["size"] = s.size;
  d["mtime_ns"] = s.mtime_ns;
  d["atime_ns"] = s.atime_ns;
  d["pin_until_ns"] = s.pin_until_ns;  // 0 not pinned, -1 forever
  return d;
}

nb::list MetaList(const std::vector<SessionMeta>& v) {
  nb::list out;
  for (const auto& s : v) out.append(MetaDict(s));
  return out;
}

std::unique_ptr<PyStore> Open(const std::string& uri, bool create) {
  Result<std::unique_ptr<Store>> s = Status::Internal("unset");
  {
    nb::gil_scoped_release release;
    s = create ? OpenStore(uri) : OpenExistingStore(uri);
  }
  return std::unique_ptr<PyStore>(new PyStore{ValueOrThrow(std::move(s))});
}

nb::list Sessions(PyStore& ps, const std::string& prefix) {
  std::vector<SessionMeta> sessions;
  {
    nb::gil_scoped_release release;
    auto admin = OpenSessionAdmin(ps.store.get());
    if (admin.ok()) {
      sessions = ValueOrThrow((*admin)->ListSessions());
    } else {  // a store without admin state (memory://): plain listing
      for (const ObjectInfo& o : ValueOrThrow(ps.store->List(prefix))) {
        SessionMeta m;
        m.key = o.key;
        m.size = o.size;
        m.mtime_ns = o.mtime_ns;
        sessions.push_back(std::move(m));
      }
    }
  }
  nb::list out;
  for (const auto& s : sessions) {
    if (s.key.compare(0, prefix.size(), prefix) == 0) out.append(MetaDict(s));
  }
  return out;
}

uint64_t Size(PyStore& ps, const std::string& key) {
  nb::gil_scoped_release release;
  auto object = ValueOrThrow(ps.store->Open(key));
  return object->Size();
}

bool Exists(PyStore& ps, const std::string& key) {
  nb::gil_scoped_release release;
  auto object = ps.store->Open(key);
  if (object.ok()) return true;
  if (object.status().IsNotFound()) return false;
  throw StatusError(object.status());
}

void Remove(PyStore& ps, const std::string& key) {
  nb::gil_scoped_release release;
  ThrowIfError(ps.store->Remove(key));
  if (auto admin = OpenSessionAdmin(ps.store.get()); admin.ok()) {
    (void)(*admin)->SetPin(key, 0);  // as `tqkv rm`: no pin outlives its session
  }
}

void SetPin(PyStore& ps, const std::string& key, int64_t until_ns) {
  nb::gil_scoped_release release;
  auto admin = ValueOrThrow(OpenSessionAdmin(ps.store.get()));
  ThrowIfError(admin->SetPin(key, until_ns));
}

nb::dict Gc(PyStore& ps, uint64_t max_bytes, int64_t ttl_s, int64_t temp_age_s, bool dry_run) {
  GcOptions o;
  o.max_bytes = max_bytes;
  o.ttl = std::chrono::seconds(ttl_s);
  o.temp_min_age = std::chrono::seconds(temp_age_s);
  o.dry_run = dry_run;
  GcReport r;
  {
    nb::gil_scoped_release release;
    r = ValueOrThrow(CollectGarbage(ps.store.get(), o));
  }
  nb::dict d;
  d["dry_run"] = dry_run;
  d["bytes_before"] = r.bytes_before;
  d["bytes_after"] = r.bytes_after;
  d["expired"] = MetaList(r.expired);
  d["evicted"] = MetaList(r.evicted);
  d["pinned_kept"] = r.pinned_kept;
  d["temps_removed"] = r.temps_removed;
  d["over_cap_after"] = r.over_cap_after;
  return d;
}

// The JSON text of `tqkv inspect --json` (the Python layer parses it).
std::string DescribeJson(PyStore& ps, const std::string& key, bool chunks) {
  nb::gil_scoped_release release;
  auto object = ValueOrThrow(ps.store->Open(key));
  auto reader = ValueOrThrow(ContainerReader::Open(object.get(), key));
  return ContainerDescriptionJson(DescribeContainer(*reader), chunks);
}

void Verify(PyStore& ps, const std::string& key) {
  nb::gil_scoped_release release;
  ThrowIfError(VerifyObject(*ps.store, key));
}

}  // namespace

void BindStore(nb::module_& m) {
  nb::class_<PyStore>(m, "Store")
      .def_prop_ro("uri", [](const PyStore& s) { return s.store->Uri(); })
      .def_prop_ro("name", [](const PyStore& s) { return std::string(s.store->Name()); })
      .def("sessions", &Sessions, nb::arg("prefix"))
      .def("size", &Size, nb::arg("key"))
      .def("exists", &Exists, nb::arg("key"))
      .def("remove", &Remove, nb::arg("key"))
      .def("set_pin", &SetPin, nb::arg("key"), nb::arg("until_ns"))
      .def("gc", &Gc, nb::arg("max_bytes"), nb::arg("ttl_s"), nb::arg("temp_age_s"),
           nb::arg("dry_run"))
      .def("describe_json", &DescribeJson, nb::arg("key"), nb::arg("chunks"))
      .def("verify", &Verify, nb::arg("key"));
  m.def("open_store", &Open, nb::arg("uri"), nb::arg("create"));
  m.attr("PIN_FOREVER") = kPinForever;
}

}  // namespace tqkv::python
