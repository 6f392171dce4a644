// libFuzzer target for the .tqkv container reader and the decoder behind it.
//
// Each input is checked three times: as it is (mostly exercising checksum and range checks), with
// its structural checksums recomputed (so mutations of sizes, counts and offsets reach the
// semantic checks behind the checksums), and with its chunk checksums recomputed as well (so
// mutated payloads reach the decoder). For each the in-memory parser and ContainerReader must
// agree, a file that parses must be rewritten byte for byte by ContainerWriter (the layout is
// canonical), and it must decode (RestoreStreaming, f32, every layer) or be refused as bad data,
// within the resource bound of docs/format.md "Resource limits": decoded bytes at most 32 x the
// file size, codec tables within kMaxSetupBytes. Time and memory caps come from libFuzzer: run
// with -timeout and -rss_limit_mb.
// Build: -DTQKV_BUILD_FUZZERS=ON with clang. Run with the seeds (a valid file is at least 4176
// bytes, above libFuzzer's default -max_len of 4096 when it starts from an empty corpus):
//   mkdir -p /tmp/cf && ./build-fuzz/container_fuzz -max_total_time=30 -timeout=10 \
//       -rss_limit_mb=2048 -max_len=65536 /tmp/cf fuzz/corpus/container
// (new inputs go to the first directory; fuzz/corpus/container holds only the checked-in seeds,
// among them Haar and large-head_dim shapes at and over the limits).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "format/container_parse.h"
#include "format/container_testing.h"
#include "tqkv/checkpoint.h"
#include "tqkv/codec.h"
#include "tqkv/container.h"
#include "tqkv/store.h"

namespace {

using tqkv::Status;

class SpanReadable final : public tqkv::ReadableObject {
 public:
  explicit SpanReadable(std::span<const uint8_t> d) : d_(d) {}
  uint64_t Size() const override { return d_.size(); }
  Status ReadAt(uint64_t offset, std::span<uint8_t> dst) override {
    if (offset > d_.size() || dst.size() > d_.size() - offset) {
      std::fprintf(stderr, "reader asked for bytes outside the file\n");
      std::abort();  // the reader must range-check before reading
    }
    if (!dst.empty()) std::memcpy(dst.data(), d_.data() + offset, dst.size());
    return Status::Ok();
  }
  Status ReadBatch(std::span<const tqkv::ReadRequest> reqs) override {
    for (const auto& r : reqs) {
      Status s = ReadAt(r.offset, r.dst);
      if (!s.ok()) return s;
    }
    return Status::Ok();
  }

 private:
  std::span<const uint8_t> d_;
};

class VectorWritable final : public tqkv::WritableObject {
 public:
  Status Append(std::span<const uint8_t> src) override {
    bytes.insert(bytes.end(), src.begin(), src.end());
    return Status::Ok();
  }
  Status Commit() override { return Status::Ok(); }
  Status Abort() override { return Status::Ok(); }
  uint64_t BytesWritten() const override { return bytes.size(); }
  std::vector<uint8_t> bytes;
};

// A read-only store holding one object (the input) under any key.
class SpanStore final : public tqkv::Store {
 public:
  explicit SpanStore(std::span<const uint8_t> d) : d_(d) {}
  std::string_view Name() const override { return "fuzz"; }
  std::string Uri() const override { return "fuzz://"; }
  tqkv::StoreCaps Caps() const override { return {}; }
  tqkv::Result<std::unique_ptr<tqkv::WritableObject>> Create(std::string_view) override {
    return Status::Unsupported("fuzz store is read-only");
  }
  tqkv::Result<std::unique_ptr<tqkv::ReadableObject>> Open(std::string_view) override {
    return std::unique_ptr<tqkv::ReadableObject>(new SpanReadable(d_));
  }
  Status Remove(std::string_view) override { return Status::Unsupported("read-only"); }
  tqkv::Result<std::vector<tqkv::ObjectInfo>> List(std::string_view) override {
    return std::vector<tqkv::ObjectInfo>{};
  }

 private:
  std::span<const uint8_t> d_;
};

[[noreturn]] void Fail(const char* what, const Status& s) {
  std::fprintf(stderr, "container_fuzz: %s: %s\n", what, s.ToString().c_str());
  std::abort();
}

void Decode(std::span<const uint8_t> file, const tqkv::ContainerHeader& h);

void Check(std::span<const uint8_t> file) {
  auto parsed = tqkv::format::ParseAndVerifyContainer(file, "fuzz.tqkv");

  // The reader (Open + ReadChunk of every chunk) must reach the same verdict.
  SpanReadable in(file);
  Status reader_status;
  auto reader = tqkv::ContainerReader::Open(&in, "fuzz.tqkv");
  if (!reader.ok()) {
    reader_status = reader.status();
  } else {
    std::vector<uint8_t> buf;
    for (const auto& e : (*reader)->chunks()) {
      buf.resize(e.size);
      reader_status = (*reader)->ReadChunk(e, buf);
      if (!reader_status.ok()) break;
    }
  }
  if (parsed.ok() != reader_status.ok() || parsed.status().code() != reader_status.code()) {
    Fail("parser and reader disagree", parsed.ok() ? reader_status : parsed.status());
  }
  if (!parsed.ok()) {
    const auto code = parsed.status().code();
    if (code != tqkv::StatusCode::kCorruption && code != tqkv::StatusCode::kUnsupported) {
      Fail("unexpected error code", parsed.status());
    }
    return;
  }

  // Canonical layout: rewriting the parsed header and payloads reproduces the file.
  VectorWritable out;
  auto writer = tqkv::ContainerWriter::Create(&out, parsed->header);
  if (!writer.ok()) Fail("writer refuses a header the reader accepted", writer.status());
  for (const auto& e : parsed->chunks) {
    Status s = (*writer)->AddChunk(e, file.subspan(e.offset, e.size));
    if (!s.ok()) Fail("writer refuses a chunk the reader accepted", s);
  }
  if (Status s = (*writer)->Finish(); !s.ok()) Fail("writer Finish", s);
  if (out.bytes.size() != file.size() ||
      std::memcmp(out.bytes.data(), file.data(), file.size()) != 0) {
    Fail("rewrite differs from the input", Status::Internal("not canonical"));
  }
  Decode(file, parsed->header);
}

// Decodes an accepted file as `tqkv restore` does, checking the documented resource bound.
void Decode(std::span<const uint8_t> file, const tqkv::ContainerHeader& h) {
  uint64_t setup = 0;
  for (const auto& c : h.codecs) setup += tqkv::SetupCostOf(c).bytes;
  if (setup > tqkv::kMaxSetupBytes) Fail("codec tables over the limit", Status::Internal("setup"));
  const uint64_t decoded = tqkv::SessionTensorBytes(h, tqkv::DType::kF32);
  if (decoded / 32 > file.size()) {
    Fail("decoded size over 32 x the file size", Status::Internal(std::to_string(decoded)));
  }
  SpanStore store(file);
  tqkv::RestoreOptions opts;
  opts.dtype = tqkv::DType::kF32;
  uint32_t layers = 0;
  Status s;
  if (tqkv::IsRagged(h)) {  // (a streaming restore refuses ragged layers; Restore holds them)
    s = tqkv::Restore(store, "fuzz", opts).status();
    if (s.ok()) layers = h.geometry.layers;
  } else {
    s = tqkv::RestoreStreaming(store, "fuzz", opts, [&](uint32_t, const void*, const void*) {
      ++layers;
      return Status::Ok();
    });
  }
  // The parser checks structure, not payload semantics: the decoder may still refuse a payload
  // (e.g. group metadata marking the wrong number of outlier channels), but only as bad data.
  if (!s.ok()) {
    if (s.code() != tqkv::StatusCode::kCorruption &&
        s.code() != tqkv::StatusCode::kInvalidArgument) {
      Fail("restore fails with an unexpected code", s);
    }
    return;
  }
  if (layers != h.geometry.layers) Fail("restore skipped layers", Status::Internal("layers"));
}

// Recomputes each chunk's checksum in its index record (records that lie in the file), then the
// structural checksums: mutated payload bytes then reach the decoder.
void ResignChunks(std::span<uint8_t> f) {
  using namespace tqkv::format;
  if (f.size() < kMinAnyFileBytes) return;
  const uint64_t fat = f.size() - kFooterBytes;
  const uint64_t io = LoadU64(f.data() + fat), is = LoadU64(f.data() + fat + 8);
  if (is < kIndexFixedBytes || io > fat || is > fat - io) return;
  const uint64_t records = (is - kIndexFixedBytes) / kIndexRecordBytes;
  for (uint64_t i = 0; i < records; ++i) {
    uint8_t* r = f.data() + io + 8 + i * kIndexRecordBytes;
    const uint64_t off = LoadU64(r + 24), size = LoadU64(r + 32);
    if (off <= f.size() && size <= f.size() - off) StoreU64(r + 40, Checksum(f.subspan(off, size)));
  }
  ResignContainerForTesting(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> file(data, size);
  Check(file);
  std::vector<uint8_t> resigned(file.begin(), file.end());
  tqkv::format::ResignContainerForTesting(resigned);
  if (!std::equal(resigned.begin(), resigned.end(), file.begin())) Check(resigned);
  std::vector<uint8_t> rechunked = resigned;
  ResignChunks(rechunked);
  if (rechunked != resigned) Check(rechunked);
  return 0;
}
