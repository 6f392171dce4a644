#include "tqkv/synthetic_source.h"

#include "tqkv/synthetic.h"

namespace tqkv {
namespace {

class SyntheticSource final : public KvSource {
 public:
  SyntheticSource(std::string model, ModelGeometry g, DType dtype, uint64_t tokens, uint64_t seed)
      : model_(std::move(model)),
        geometry_(g),
        dtype_(dtype),
        tokens_(tokens),
        gen_(SyntheticKind::kKv, g, seed) {}
  const std::string& model() const override { return model_; }
  const ModelGeometry& geometry() const override { return geometry_; }
  DType dtype() const override { return dtype_; }
  uint64_t tokens() const override { return tokens_; }
  Status ReadLayer(uint32_t layer, void* k, void* v) override {
    TQKV_RETURN_IF_ERROR(gen_.FillLayer(layer, 0, 0, tokens_, dtype_, k));
    return gen_.FillLayer(layer, 1, 0, tokens_, dtype_, v);
  }

 private:
  std::string model_;
  ModelGeometry geometry_;
  DType dtype_;
  uint64_t tokens_;
  SyntheticKv gen_;
};

}  // namespace

std::unique_ptr<KvSource> MakeSyntheticSource(std::string model, ModelGeometry geometry,
                                              DType dtype, uint64_t tokens, uint64_t seed) {
  return std::make_unique<SyntheticSource>(std::move(model), geometry, dtype, tokens, seed);
}

}  // namespace tqkv
