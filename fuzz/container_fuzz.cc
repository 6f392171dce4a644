// libFuzzer target for the .tqkv container reader.
//
// Each input is checked twice: as it is (mostly exercising checksum and range checks) and with its
// structural checksums recomputed (so mutations of sizes, counts and offsets reach the semantic
// checks behind the checksums). For both the in-memory parser and ContainerReader must agree, and
// a file that parses must be rewritten byte for byte by ContainerWriter (the layout is canonical).
// Build: -DTQKV_BUILD_FUZZERS=ON with clang. Run with the seeds (a valid file is at least 4176
// bytes, above libFuzzer's default -max_len of 4096 when it starts from an empty corpus):
//   mkdir -p /tmp/cf && ./build-fuzz/container_fuzz -max_total_time=30 -malloc_limit_mb=256 \
//       /tmp/cf fuzz/corpus/container
// (new inputs go to the first directory; fuzz/corpus/container holds only the checked-in seeds).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "format/container_parse.h"
#include "format/container_testing.h"
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

[[noreturn]] void Fail(const char* what, const Status& s) {
  std::fprintf(stderr, "container_fuzz: %s: %s\n", what, s.ToString().c_str());
  std::abort();
}

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
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> file(data, size);
  Check(file);
  std::vector<uint8_t> resigned(file.begin(), file.end());
  tqkv::format::ResignContainerForTesting(resigned);
  Check(resigned);
  return 0;
}
