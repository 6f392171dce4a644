// Checkpoint and restore of per-layer K/V arrays (include/tqkv/checkpoint.h, kv_layout.h).
// Restore decodes into the caller's arrays in their layout (RestoreInto of LayoutTensors; staged
// only when the channels are strided). Checkpoint views the canonical contiguous layout as a
// KvCache without a copy; other layouts are gathered a layer at a time (LayoutKvSource). The GIL
// is released while the library works and taken back only for the caller's layer_ready callback.
#include <optional>
#include <span>
#include <utility>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "tqkv/batch.h"
#include "tqkv/checkpoint.h"
#include "tqkv/settings.h"
#include "tqkv/container.h"
#include "tqkv/kv_layout.h"
#include "tqkv/vllm_layout.h"

namespace tqkv::python {
namespace {

using RoArray = nb::ndarray<nb::ro, nb::device::cpu>;
using Int64Array = nb::ndarray<nb::ro, int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Which array axis is the token, head and channel axis (and the block axis when paged, else -1).
struct Axes {
  int token = 0, head = 1, dim = 2, block = -1;
};

// Per-layer K and V arrays seen through one KvLayout.
using LayerArrays = LayoutTensors;

using RwArray = nb::ndarray<>;  // CPU, or CUDA (RestoreToCudaArrays)

template <typename Array>
uint64_t ExtentElems(const Array& a) {
  uint64_t end = 1;
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (a.shape(i) == 0) return 0;
    if (a.stride(i) > 0) end += static_cast<uint64_t>(a.stride(i)) * (a.shape(i) - 1);
  }
  return end;
}

template <typename Array>
LayerArrays ViewLayers(const std::vector<Array>& k, const std::vector<Array>& v, Axes axes,
                       const std::optional<Int64Array>& block_ids, uint64_t tokens) {
  if (k.empty() || k.size() != v.size()) {
    ThrowInvalid("k and v: the same number of layers (at least one), got " +
                 std::to_string(k.size()) + " and " + std::to_string(v.size()));
  }
  const Array& a0 = k[0];
  const size_t nd = axes.block >= 0 ? 4 : 3;
  if (a0.ndim() != nd) {
    ThrowInvalid("k[0]: expected " + std::to_string(nd) + " axes for this layout, got " +
                 std::to_string(a0.ndim()));
  }
  LayerArrays out;
  out.dtype = ArrayDType(a0.dtype(), "k[0]");
  // Geometry fields are 32-bit: a larger extent is refused, never truncated.
  const auto extent32 = [](uint64_t n, const char* what) {
    if (n > UINT32_MAX) ThrowInvalid(std::string(what) + " " + std::to_string(n) + " exceeds 2^32 - 1");
    return static_cast<uint32_t>(n);
  };
  out.geometry.layers = extent32(k.size(), "layers");
  out.geometry.kv_heads = extent32(a0.shape(axes.head), "k[0]: KV heads");
  out.geometry.head_dim = extent32(a0.shape(axes.dim), "k[0]: head_dim");
  KvLayout& l = out.layout;
  l.token_stride = a0.stride(axes.token);
  l.head_stride = a0.stride(axes.head);
  l.dim_stride = a0.stride(axes.dim);
  if (axes.block >= 0) {
    if (!block_ids) ThrowInvalid("a paged layout needs block_ids");
    l.block_tokens = a0.shape(axes.token);
    l.block_stride = a0.stride(axes.block);
    l.block_ids.assign(block_ids->data(), block_ids->data() + block_ids->shape(0));
    out.tokens = tokens;
  } else {
    out.tokens = a0.shape(axes.token);
    if (tokens != 0 && tokens != out.tokens) {
      ThrowInvalid("tokens=" + std::to_string(tokens) + " but the arrays hold " +
                   std::to_string(out.tokens));
    }
  }
  if (out.tokens > 0 && out.geometry.token_elems() == 0) ThrowInvalid("k[0]: empty heads");
  out.tensor_elems = ExtentElems(a0);
  ThrowIfError(ValidateKvLayout(l, out.geometry, out.tokens, out.tensor_elems).WithContext("k[0]"));
  for (int kv = 0; kv < 2; ++kv) {
    const auto& arrays = kv == 0 ? k : v;
    for (size_t i = 0; i < arrays.size(); ++i) {
      const Array& a = arrays[i];
      bool same = a.ndim() == nd && a.dtype() == a0.dtype();
      for (size_t d = 0; same && d < nd; ++d) {
        same = a.shape(d) == a0.shape(d) && a.stride(d) == a0.stride(d);
      }
      if (!same) {
        ThrowInvalid(std::string(kv == 0 ? "k[" : "v[") + std::to_string(i) +
                     "]: every layer's K and V must have k[0]'s shape, strides and dtype");
      }
      void* p = const_cast<void*>(static_cast<const void*>(a.data()));
      (kv == 0 ? out.k : out.v).push_back(p);
    }
  }
  return out;
}

}  // namespace

nb::dict SettingsDict(const ResolvedSettings& settings) {
  nb::dict st;
  st["codec"] = settings.codec;
  st["layer_codecs"] = settings.layer_codecs;
  st["exact_tokens"] = settings.exact_tokens;
  st["key_means"] = settings.key_means;
  st["strict"] = settings.strict;
  st["guard"] = settings.guard;
  st["alignment"] = settings.alignment;
  return st;
}

nb::dict CheckpointStatsDict(const CheckpointStats& s, const ResolvedSettings& settings) {
  nb::dict d;
  d["bytes_written"] = s.bytes_written;
  d["fp16_bytes"] = s.fp16_bytes;
  d["seconds"] = s.seconds;
  d["encode_seconds"] = s.encode_seconds;
  d["write_seconds"] = s.write_seconds;
  d["guard_seconds"] = s.guard_seconds;
  // The guard (docs/codec.md §9): each layer's [K, V] codec error relative to the varying part of
  // the vectors, and the entries over the threshold (empty with guard=False).
  d["guard_stride"] = s.guard_stride;
  nb::list errors;
  for (size_t l = 0; l + 1 < s.codec_error.size(); l += 2) {
    errors.append(nb::make_tuple(RelativeError(s.codec_error[l]),
                                 RelativeError(s.codec_error[l + 1])));
  }
  d["codec_error"] = errors;
  nb::list exceeded;
  for (uint32_t i : s.guard_exceeded) {
    exceeded.append(nb::make_tuple(i / 2, i % 2 ? "V" : "K", RelativeError(s.codec_error[i])));
  }
  d["guard_exceeded"] = exceeded;
  nb::list allocated;
  for (const auto& kv : s.allocated) allocated.append(nb::make_tuple(kv[0], kv[1]));
  d["allocated"] = allocated;
  d["settings"] = SettingsDict(settings);
  return d;
}

CheckpointSettings SettingsOf(const std::optional<std::string>& codec,
                              const std::vector<std::string>& layer_codecs,
                              const std::optional<std::string>& exact_tokens,
                              const std::optional<std::string>& key_means,
                              std::optional<bool> strict, std::optional<bool> guard,
                              std::optional<uint64_t> alignment) {
  return {codec, layer_codecs, exact_tokens, key_means, strict, guard, alignment};
}

namespace {

nb::dict RestoreStatsDict(const RestoreStats& s, bool staged) {
  nb::dict d;
  d["staged"] = staged;  // false: decoded straight into the caller's arrays
  d["bytes_read"] = s.bytes_read;
  d["bytes_direct"] = s.read_path.direct;
  d["bytes_uring"] = s.read_path.uring;
  d["bytes_page_cache"] = s.read_path.page_cache;
  d["fp16_bytes"] = s.fp16_bytes;
  d["tokens"] = s.tokens;
  d["model"] = s.model;
  d["seconds"] = s.seconds;
  d["read_busy_seconds"] = s.read_busy_seconds;
  d["decode_busy_seconds"] = s.decode_busy_seconds;
  d["first_layer_seconds"] = s.first_layer_seconds;
  d["drop_cache_ok"] = s.drop_cache_ok;
  return d;
}

nb::dict CheckpointArrays(PyStore& ps, const std::string& key, const std::vector<RoArray>& k,
                          const std::vector<RoArray>& v, Axes axes,
                          const std::optional<Int64Array>& block_ids, uint64_t tokens,
                          const CheckpointSettings& settings, const std::string& model,
                          uint32_t token_block) {
  LayerArrays la = ViewLayers(k, v, axes, block_ids, tokens);
  CheckpointOptions opts = ValueOrThrow(ResolveCheckpointOptions(settings));
  opts.token_block = token_block;
  auto pool = Pool();
  opts.pool = pool.get();
  Result<CheckpointStats> stats = Status::Internal("unset");
  const bool canonical = la.layout.IsCanonical(la.geometry);
  {
    nb::gil_scoped_release release;
    if (canonical) {  // zero copy: the arrays are the KvCache
      KvCache cache(model, la.geometry, la.dtype, la.tokens);
      for (uint32_t l = 0; l < la.geometry.layers; ++l) cache.SetLayer(l, la.k[l], la.v[l]);
      stats = Checkpoint(cache, opts, *ps.store, key);
    } else {
      LayoutKvSource source(model, la.geometry, la.dtype, la.tokens, la.layout,
                            {la.k.begin(), la.k.end()}, {la.v.begin(), la.v.end()});
      stats = Checkpoint(source, opts, *ps.store, key);
    }
  }
  nb::dict d = CheckpointStatsDict(ValueOrThrow(std::move(stats)), DescribeSettings(settings, opts));
  d["staged"] = !canonical;  // false: the library read the caller's arrays in place
  return d;
}

nb::dict HeaderDict(const ContainerHeader& h) {
  nb::dict d;
  d["model"] = h.model;
  d["layers"] = h.geometry.layers;
  d["kv_heads"] = h.geometry.kv_heads;
  d["head_dim"] = h.geometry.head_dim;
  d["tokens"] = h.tokens;
  d["source_dtype"] = std::string(DTypeName(h.source_dtype));
  d["exact_head"] = h.exact_head;
  d["exact_tail"] = h.exact_tail;
  d["key_mean_block"] = h.key_mean_block;
  return d;
}

nb::dict Header(PyStore& ps, const std::string& key) {
  ContainerHeader h;
  {
    nb::gil_scoped_release release;
    auto object = ValueOrThrow(ps.store->Open(key));
    auto reader = ValueOrThrow(ContainerReader::Open(object.get(), key));
    h = reader->header();
  }
  return HeaderDict(h);
}

// Calls the Python layer_ready(layer) with the GIL; a Python exception stops the restore and is
// re-raised once the library returns.
struct LayerReady {
  nb::object fn;  // None: no callback
  std::optional<nb::python_error> error;
  Status operator()(uint32_t layer) {
    if (fn.is_none()) return Status::Ok();
    nb::gil_scoped_acquire acquire;
    try {
      fn(layer);
    } catch (nb::python_error& e) {
      error.emplace(std::move(e));
      return Status::Internal("layer_ready raised");
    }
    return Status::Ok();
  }
};

// What both array restores set up alike: the thread pool, the read options and the caller's
// layer_ready. Stays where it is built: opts.layer_ready refers to `ready`.
struct ArrayRestore {
  ArrayRestore(nb::object layer_ready, bool drop_cache, uint64_t inflight_bytes)
      : pool(Pool()), ready{std::move(layer_ready), std::nullopt} {
    opts.pool = pool.get();
    opts.drop_cache = drop_cache;
    if (inflight_bytes) opts.inflight_bytes = inflight_bytes;
    opts.layer_ready = [this](uint32_t layer) { return ready(layer); };
  }
  ArrayRestore(const ArrayRestore&) = delete;
  ArrayRestore& operator=(const ArrayRestore&) = delete;

  std::shared_ptr<ThreadPool> pool;
  LayerReady ready;
  RestoreOptions opts;
  RestoreStats stats;
};

nb::dict RestoreArrays(PyStore& ps, const std::string& key, const std::vector<RwArray>& k,
                       const std::vector<RwArray>& v, Axes axes,
                       const std::optional<Int64Array>& block_ids, uint64_t tokens,
                       nb::object layer_ready, bool drop_cache,
                       uint64_t inflight_bytes) {
  LayerArrays la = ViewLayers(k, v, axes, block_ids, tokens);
  ArrayRestore r(std::move(layer_ready), drop_cache, inflight_bytes);
  r.opts.dtype = la.dtype;
  r.opts.expect_geometry = &la.geometry;
  const int device_type = k[0].device_type(), device_id = k[0].device_id();
  for (const auto* arrays : {&k, &v}) {
    for (const RwArray& a : *arrays) {
      if (a.device_type() != device_type || a.device_id() != device_id) {
        ThrowInvalid("k and v: every array on the same device");
      }
    }
  }
  const bool cuda = device_type != nb::device::cpu::value;
  if (cuda && device_type != nb::device::cuda::value) {
    ThrowInvalid("out=: arrays in host or CUDA device memory only (DLPack device type " +
                 std::to_string(device_type) + ")");
  }
  Status s;
  {
    nb::gil_scoped_release release;
    s = cuda ? RestoreToCudaArrays(*ps.store, key, la, device_id, r.opts.layer_ready, &r.stats)
             : RestoreInto(*ps.store, key, la, r.opts, &r.stats);
  }
  if (r.ready.error) throw std::move(*r.ready.error);
  ThrowIfError(s);
  // The CUDA path decodes in place whatever the strides (channels contiguous, else refused).
  return RestoreStatsDict(r.stats, !cuda && !DecodesInPlace(la.layout, la.geometry, la.tokens));
}

// Restores into arrays that `allocate(header)` returns as (k_layers, v_layers) once the header
// is read: the object is opened once. Host arrays only (CUDA goes through restore_into).
nb::dict RestoreNew(PyStore& ps, const std::string& key, Axes axes, nb::object allocate,
                    nb::object layer_ready, bool drop_cache, uint64_t inflight_bytes) {
  std::vector<RwArray> k, v;
  std::optional<nb::python_error> error;
  bool staged = false;
  MakeDestination make = [&](const ContainerHeader& h) -> Result<LayoutTensors> {
    nb::gil_scoped_acquire acquire;
    try {
      nb::tuple kv = nb::cast<nb::tuple>(allocate(HeaderDict(h)));
      k = nb::cast<std::vector<RwArray>>(kv[0]);
      v = nb::cast<std::vector<RwArray>>(kv[1]);
      LayerArrays la = ViewLayers(k, v, axes, std::nullopt, 0);
      staged = !DecodesInPlace(la.layout, la.geometry, la.tokens);
      return la;
    } catch (nb::python_error& e) {
      error.emplace(std::move(e));
      return Status::Internal("allocate raised");
    } catch (StatusError& e) {
      return e.status();
    }
  };
  ArrayRestore r(std::move(layer_ready), drop_cache, inflight_bytes);
  Status s;
  {
    nb::gil_scoped_release release;
    s = RestoreInto(*ps.store, key, make, r.opts, &r.stats);
  }
  if (error) throw std::move(*error);
  if (r.ready.error) throw std::move(*r.ready.error);
  ThrowIfError(s);
  return RestoreStatsDict(r.stats, staged);
}


// An engine's paged K/V memory for the batch calls, built once and reused: the layouts, with the
// arrays kept alive while the pointers are in use.
struct PagedArrays {
  LayoutTensors t;
  std::vector<RwArray> arrays;
  bool cuda = false;
  int device = 0;
};

// Paged K and V arrays (one per layer, equal shapes and strides) in `axes`; tokens per object.
PagedArrays MakePagedArrays(std::vector<RwArray> k, std::vector<RwArray> v, Axes axes,
                            uint64_t tokens) {
  if (axes.block < 0) ThrowInvalid("a batch moves paged arrays: layout 'paged' or 'paged_hnd'");
  if (k.empty()) ThrowInvalid("k and v: at least one layer");
  const uint64_t block = k[0].ndim() == 4 ? k[0].shape(axes.token) : 0;
  if (block == 0 || tokens == 0) ThrowInvalid("paged arrays need blocks of at least one token");
  // Validated against block 0 here; each object's own block ids when it is moved.
  std::vector<int64_t> zeros((tokens + block - 1) / block, 0);
  const size_t shape[1] = {zeros.size()};
  Int64Array ids(zeros.data(), 1, shape);
  PagedArrays out;
  out.t = ViewLayers(k, v, axes, ids, tokens);
  out.t.layout.block_ids.clear();
  out.cuda = k[0].device_type() != nb::device::cpu::value;
  out.device = k[0].device_id();
  for (const auto* arrays : {&k, &v}) {
    for (const RwArray& a : *arrays) {
      if (a.device_type() != k[0].device_type() || a.device_id() != k[0].device_id()) {
        ThrowInvalid("k and v: every array on the same device");
      }
    }
  }
  if (out.cuda && k[0].device_type() != nb::device::cuda::value) {
    ThrowInvalid("paged arrays in host or CUDA device memory only");
  }
  out.arrays = std::move(k);
  out.arrays.insert(out.arrays.end(), v.begin(), v.end());
  return out;
}

// vLLM's CPU cache: one C-contiguous [blocks, kv_heads, block_size, 2 * head_dim] array per layer,
// ordered as attention ISA `isa` writes it (tqkv/vllm_layout.h).
PagedArrays MakeVllmCpuArrays(std::vector<RwArray> layers, const std::string& isa,
                              uint32_t kv_heads, uint32_t head_dim, uint64_t tokens) {
  if (layers.empty()) ThrowInvalid("layers: at least one");
  const RwArray& a0 = layers[0];
  if (a0.ndim() != 4 || a0.shape(1) != kv_heads || a0.shape(3) != 2ull * head_dim ||
      a0.device_type() != nb::device::cpu::value) {
    ThrowInvalid("vLLM CPU cache layer: a host array [blocks, " + std::to_string(kv_heads) +
                 ", block_size, " + std::to_string(2 * head_dim) + "]");
  }
  PagedArrays out;
  out.t.dtype = ArrayDType(a0.dtype(), "layers[0]");
  out.t.geometry = ModelGeometry{static_cast<uint32_t>(layers.size()), kv_heads, head_dim};
  out.t.tokens = tokens;
  const uint64_t block = a0.shape(2);
  VllmCpuLayouts l = ValueOrThrow(VllmCpuCacheLayouts(isa, out.t.geometry, block, out.t.dtype));
  out.t.layout = std::move(l.k);
  out.t.v_layout = std::move(l.v);
  out.t.tensor_elems = 1;
  for (size_t d = 0; d < 4; ++d) out.t.tensor_elems *= a0.shape(d);
  for (size_t i = 0; i < layers.size(); ++i) {
    const RwArray& a = layers[i];
    bool same = a.ndim() == 4 && a.dtype() == a0.dtype() &&
                a.device_type() == nb::device::cpu::value;
    int64_t stride = 1;
    for (size_t d = 4; same && d-- > 0;) {
      same = a.shape(d) == a0.shape(d) && (a.shape(d) == 1 || a.stride(d) == stride);
      stride *= static_cast<int64_t>(a.shape(d));
    }
    if (!same) ThrowInvalid("layers[" + std::to_string(i) + "]: layers[0]'s shape and dtype, "
                            "C-contiguous");
    out.t.k.push_back(const_cast<void*>(static_cast<const void*>(a.data())));
  }
  out.t.v = out.t.k;
  out.arrays = std::move(layers);
  return out;
}

struct BatchArgs {
  std::vector<BatchObject> objects;
};

BatchArgs Objects(const std::vector<std::string>& keys, const std::vector<std::string>& models,
                  const std::vector<Int64Array>& block_ids,
                  const std::vector<uint64_t>& first_tokens,
                  const std::vector<uint64_t>& tokens) {
  const size_t n = keys.size();
  if (block_ids.size() != n || (!models.empty() && models.size() != n) ||
      (!first_tokens.empty() && first_tokens.size() != n) ||
      (!tokens.empty() && tokens.size() != n)) {
    ThrowInvalid("keys, block_ids (and models, first_tokens, tokens when given): one per object");
  }
  BatchArgs b;
  b.objects.resize(n);
  for (size_t i = 0; i < n; ++i) {
    BatchObject& o = b.objects[i];
    o.key = keys[i];
    o.block_ids.assign(block_ids[i].data(), block_ids[i].data() + block_ids[i].shape(0));
    if (!models.empty()) o.model = models[i];
    if (!first_tokens.empty()) o.first_token = first_tokens[i];
    if (!tokens.empty()) o.tokens = tokens[i];
  }
  return b;
}

nb::dict BatchDict(const BatchStats& st, const Status& s) {
  nb::dict d;
  d["done"] = st.done;
  d["skipped"] = st.skipped;
  d["bytes"] = st.bytes;
  d["fp16_bytes"] = st.fp16_bytes;
  d["tokens"] = st.tokens;
  d["seconds"] = st.seconds;
  d["first_layer_seconds"] = st.first_layer_seconds;
  d["error"] = s.ok() ? nb::none() : nb::cast(s.ToString());
  return d;
}

nb::dict RestoreBatchArrays(PyStore& ps, const std::vector<std::string>& keys,
                            const std::vector<std::string>& models,
                            const std::vector<Int64Array>& block_ids,
                            const std::vector<uint64_t>& tokens, const PagedArrays& dst,
                            nb::object layer_ready, bool drop_cache, size_t in_flight) {
  BatchArgs b = Objects(keys, models, block_ids, {}, tokens);
  ArrayRestore r(std::move(layer_ready), drop_cache, 0);
  r.opts.dtype = dst.t.dtype;
  r.opts.expect_geometry = &dst.t.geometry;
  BatchOptions bo;
  if (in_flight) bo.objects_in_flight = in_flight;
  BatchStats st;
  Status s;
  {
    nb::gil_scoped_release release;
    s = dst.cuda ? RestoreBatchToCudaArrays(*ps.store, b.objects, dst.t, dst.device,
                                            r.opts.layer_ready, &st)
                 : RestoreBatch(*ps.store, b.objects, dst.t, r.opts, bo, &st);
  }
  if (r.ready.error) throw std::move(*r.ready.error);
  return BatchDict(st, s);
}

nb::dict CheckpointBatchArrays(PyStore& ps, const std::vector<std::string>& keys,
                               const std::vector<std::string>& models,
                               const std::vector<Int64Array>& block_ids,
                               const std::vector<uint64_t>& first_tokens,
                               const std::vector<uint64_t>& tokens, const PagedArrays& src,
                               const CheckpointSettings& settings, uint32_t token_block,
                               size_t in_flight, bool skip_existing) {
  if (src.cuda) ThrowInvalid("checkpoint reads host memory: CUDA arrays are not read");
  BatchArgs b = Objects(keys, models, block_ids, first_tokens, tokens);
  CheckpointOptions opts = ValueOrThrow(ResolveCheckpointOptions(settings));
  opts.token_block = token_block;
  auto pool = Pool();
  opts.pool = pool.get();
  BatchOptions bo;
  if (in_flight) bo.objects_in_flight = in_flight;
  bo.skip_existing = skip_existing;
  BatchStats st;
  Status s;
  {
    nb::gil_scoped_release release;
    s = CheckpointBatch(*ps.store, b.objects, src.t, opts, bo, &st);
  }
  nb::dict d = BatchDict(st, s);
  d["settings"] = SettingsDict(DescribeSettings(settings, opts));
  return d;
}

}  // namespace

void BindSession(nb::module_& m) {
  nb::class_<Axes>(m, "Axes")
      .def(nb::init<>())
      .def_rw("token", &Axes::token)
      .def_rw("head", &Axes::head)
      .def_rw("dim", &Axes::dim)
      .def_rw("block", &Axes::block);
  nb::class_<CheckpointSettings>(m, "CheckpointSettings");
  m.def("checkpoint_settings", &SettingsOf, nb::arg("codec").none(), nb::arg("layer_codecs"),
        nb::arg("exact_tokens").none(), nb::arg("key_means").none(), nb::arg("strict").none(),
        nb::arg("guard").none(), nb::arg("alignment").none());
  m.def("resolve_settings", [](const CheckpointSettings& s) {
    const CheckpointOptions o = ValueOrThrow(ResolveCheckpointOptions(s));
    return SettingsDict(DescribeSettings(s, o));
  }, nb::arg("settings"));
  m.def("checkpoint", &CheckpointArrays, nb::arg("store"), nb::arg("key"), nb::arg("k"),
        nb::arg("v"), nb::arg("axes"), nb::arg("block_ids").none(), nb::arg("tokens"),
        nb::arg("settings"), nb::arg("model"), nb::arg("token_block"));
  m.def("restore_into", &RestoreArrays, nb::arg("store"), nb::arg("key"), nb::arg("k"),
        nb::arg("v"), nb::arg("axes"), nb::arg("block_ids").none(), nb::arg("tokens"),
        nb::arg("layer_ready").none(), nb::arg("drop_cache"), nb::arg("inflight_bytes"));
  m.def("header", &Header, nb::arg("store"), nb::arg("key"));
  nb::class_<PagedArrays>(m, "PagedArrays")
      .def_prop_ro("tokens", [](const PagedArrays& a) { return a.t.tokens; })
      .def_prop_ro("staged", [](const PagedArrays& a) { return !DecodesInPlace(a.t); })
      .def_prop_ro("layers", [](const PagedArrays& a) { return a.t.geometry.layers; });
  m.def("paged_arrays", &MakePagedArrays, nb::arg("k"), nb::arg("v"), nb::arg("axes"),
        nb::arg("tokens"));
  m.def("vllm_cpu_arrays", &MakeVllmCpuArrays, nb::arg("layers"), nb::arg("isa"),
        nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("tokens"));
  m.def("restore_batch", &RestoreBatchArrays, nb::arg("store"), nb::arg("keys"),
        nb::arg("models"), nb::arg("block_ids"), nb::arg("tokens"), nb::arg("dst"),
        nb::arg("layer_ready").none(),
        nb::arg("drop_cache"), nb::arg("in_flight"));
  m.def("checkpoint_batch", &CheckpointBatchArrays, nb::arg("store"), nb::arg("keys"),
        nb::arg("models"), nb::arg("block_ids"), nb::arg("first_tokens"), nb::arg("tokens"),
        nb::arg("src"),
        nb::arg("settings"), nb::arg("token_block"), nb::arg("in_flight"),
        nb::arg("skip_existing"));
  m.def("restore_new", &RestoreNew, nb::arg("store"), nb::arg("key"), nb::arg("axes"),
        nb::arg("allocate"), nb::arg("layer_ready").none(), nb::arg("drop_cache"),
        nb::arg("inflight_bytes"));
}

}  // namespace tqkv::python
