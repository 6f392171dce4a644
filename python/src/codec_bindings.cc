// tqkv._tqkv.Codec: tqkv::Codec (include/tqkv/codec.h) on arrays, the GIL released while it works.
// Arrays come allocated and typed by the Python layer (tqkv/_codec.py); nothing is copied here.
#include <optional>
#include <span>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "tqkv/codec.h"

namespace tqkv::python {
namespace {

using RoArray = nb::ndarray<nb::ro, nb::device::cpu>;
using RwArray = nb::ndarray<nb::device::cpu>;

class PyCodec {
 public:
  PyCodec(const std::string& spec, uint32_t head_dim) {
    spec_ = ValueOrThrow(ParseCodecSpec(spec));
    codec_ = ValueOrThrow(Codec::Create(spec_, head_dim));
  }
  std::string spec() const { return FormatCodecSpec(spec_); }
  std::string label() const { return CodecLabel(codec_->params()); }
  uint32_t head_dim() const { return codec_->head_dim(); }
  size_t code_bytes() const { return codec_->code_bytes(); }
  size_t meta_bytes() const { return codec_->group_meta_bytes(); }
  double bits_per_value(size_t vectors_per_group) const {
    return codec_->BitsPerValue(vectors_per_group);
  }

  void SelectMeta(const RoArray& x, RwArray& meta) const {
    const DType dtype = ArrayDType(x.dtype(), "x");
    const Rows rows = RowsOf(x, head_dim(), "x");
    const std::span<uint8_t> m = MetaSpan(meta);
    nb::gil_scoped_release release;
    ThrowIfError(codec_->SelectGroupMeta(x.data(), dtype, rows.n, rows.stride, m));
  }

  void Encode(const RoArray& x, RwArray& out, const std::optional<RoArray>& meta) const {
    const DType dtype = ArrayDType(x.dtype(), "x");
    const Rows rows = RowsOf(x, head_dim(), "x");
    const std::span<uint8_t> codes = CodesSpan(out, rows.n, "out");
    const std::span<const uint8_t> m = meta ? MetaSpan(*meta) : std::span<const uint8_t>();
    auto pool = Pool();
    nb::gil_scoped_release release;
    ThrowIfError(codec_->Encode(x.data(), dtype, rows.n, rows.stride, m, codes, pool.get()));
  }

  void Decode(const RoArray& codes, RwArray& out, const std::optional<RoArray>& meta) const {
    const DType dtype = ArrayDType(out.dtype(), "out");
    const Rows rows = RowsOf(out, head_dim(), "out");
    const std::span<uint8_t> c = CodesSpan(codes, rows.n, "codes");
    const std::span<const uint8_t> m = meta ? MetaSpan(*meta) : std::span<const uint8_t>();
    auto pool = Pool();
    nb::gil_scoped_release release;
    ThrowIfError(codec_->Decode(c, rows.n, m, out.data(), dtype, rows.stride, pool.get()));
  }

 private:
  // Codes: uint8, C-contiguous, n * code_bytes() bytes.
  template <typename Array>
  std::span<uint8_t> CodesSpan(const Array& a, size_t n, const char* what) const {
    const auto t = a.dtype();
    if (t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) || t.bits != 8) {
      ThrowInvalid(std::string(what) + ": codes are uint8");
    }
    const Rows r = RowsOf(a, code_bytes(), what);
    if (r.n != n || r.stride != code_bytes()) {
      ThrowInvalid(std::string(what) + ": " + std::to_string(r.n) + " contiguous codes of " +
                   std::to_string(code_bytes()) + " bytes for " + std::to_string(n) + " vectors");
    }
    return {static_cast<uint8_t*>(const_cast<void*>(static_cast<const void*>(a.data()))),
            n * code_bytes()};
  }
  template <typename Array>
  std::span<uint8_t> MetaSpan(const Array& a) const {
    const auto t = a.dtype();
    if (t.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) || t.bits != 8 ||
        a.ndim() != 1 || a.shape(0) != meta_bytes() || (a.shape(0) > 1 && a.stride(0) != 1)) {
      ThrowInvalid("meta: a contiguous uint8 array of " + std::to_string(meta_bytes()) +
                   " bytes (Codec.meta_bytes)");
    }
    return {static_cast<uint8_t*>(const_cast<void*>(static_cast<const void*>(a.data()))),
            meta_bytes()};
  }

  CodecSpec spec_;
  std::unique_ptr<Codec> codec_;
};

}  // namespace

void BindCodec(nb::module_& m) {
  nb::class_<PyCodec>(m, "Codec")
      .def(nb::init<const std::string&, uint32_t>(), nb::arg("spec"), nb::arg("head_dim"))
      .def_prop_ro("spec", &PyCodec::spec)
      .def_prop_ro("label", &PyCodec::label)
      .def_prop_ro("head_dim", &PyCodec::head_dim)
      .def_prop_ro("code_bytes", &PyCodec::code_bytes)
      .def_prop_ro("meta_bytes", &PyCodec::meta_bytes)
      .def("bits_per_value", &PyCodec::bits_per_value, nb::arg("vectors_per_group"))
      .def("select_meta", &PyCodec::SelectMeta, nb::arg("x"), nb::arg("meta"))
      .def("encode", &PyCodec::Encode, nb::arg("x"), nb::arg("out"), nb::arg("meta").none())
      .def("decode", &PyCodec::Decode, nb::arg("codes"), nb::arg("out"), nb::arg("meta").none());
}

}  // namespace tqkv::python
