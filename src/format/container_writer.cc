// ContainerWriter: header block, chunks in container order at offsets aligned to the header's
// payload_alignment, index, footer.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "format/container_layout.h"
#include "tqkv/container.h"

namespace tqkv {
namespace {

using format::ChunkKey;
using format::ChunkSequence;

constexpr std::array<uint8_t, kContainerAlignment> kZeros{};

class ContainerWriterImpl final : public ContainerWriter {
 public:
  ContainerWriterImpl(WritableObject* out, ContainerHeader header, uint64_t expected_chunks)
      : out_(out),
        header_(std::move(header)),
        sequence_(header_),
        expected_chunks_(expected_chunks) {}

  ContainerWriterImpl(const ContainerWriterImpl&) = delete;  // sequence_ points into header_
  ContainerWriterImpl& operator=(const ContainerWriterImpl&) = delete;

  Status Start();
  Status AddChunk(const ChunkEntry& key, std::span<const uint8_t> payload) override;
  Status Finish() override;
  uint64_t BytesWritten() const override { return written_; }

 private:
  // Appends and counts; an I/O error makes the writer unusable (sticky).
  Status Append(std::span<const uint8_t> bytes);
  Status PadTo(uint64_t offset);
  Status CheckUsable() const;

  WritableObject* out_;
  ContainerHeader header_;  // owned copy: sequence_ points into it
  ChunkSequence sequence_;
  uint64_t expected_chunks_;
  uint64_t header_checksum_ = 0;
  uint64_t written_ = 0;
  std::vector<ChunkEntry> entries_;
  Status failed_;
  bool finished_ = false;
};

Status ContainerWriterImpl::CheckUsable() const {
  if (!failed_.ok()) return failed_;
  if (finished_) return Status::InvalidArgument("container writer: already finished");
  return Status::Ok();
}

Status ContainerWriterImpl::Append(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::Ok();
  Status s = out_->Append(bytes);
  if (!s.ok()) {
    failed_ = s;
    return s;
  }
  written_ += bytes.size();
  return Status::Ok();
}

Status ContainerWriterImpl::PadTo(uint64_t offset) {
  while (written_ < offset) {
    const uint64_t n = std::min<uint64_t>(offset - written_, kZeros.size());
    TQKV_RETURN_IF_ERROR(Append({kZeros.data(), static_cast<size_t>(n)}));
  }
  return Status::Ok();
}

Status ContainerWriterImpl::Start() {
  const std::vector<uint8_t> body = format::EncodeHeaderBody(header_);
  if (body.size() > UINT32_MAX) return Status::InvalidArgument("container header too large");
  std::vector<uint8_t> block(format::kPreambleBytes + body.size());
  const auto preamble = format::EncodePreamble(static_cast<uint32_t>(body.size()),
                                                ContainerVersionFor(header_));
  std::memcpy(block.data(), preamble.data(), preamble.size());
  std::memcpy(block.data() + format::kPreambleBytes, body.data(), body.size());
  header_checksum_ = format::HeaderChecksum(block);
  format::StoreU64(block.data() + format::kHeaderChecksumOffset, header_checksum_);
  TQKV_RETURN_IF_ERROR(Append(block));
  return PadTo(format::AlignUp(written_, header_.payload_alignment));
}

Status ContainerWriterImpl::AddChunk(const ChunkEntry& key, std::span<const uint8_t> payload) {
  TQKV_RETURN_IF_ERROR(CheckUsable());
  if (sequence_.done()) {
    return Status::InvalidArgument("container writer: unexpected chunk " +
                                   format::DescribeChunk(key) + " after the last one");
  }
  const ChunkKey want = sequence_.current();
  if (!want.Matches(key)) {
    return Status::InvalidArgument("container writer: chunk out of order: expected " +
                                   format::DescribeChunk(want) + ", got " +
                                   format::DescribeChunk(key));
  }
  TQKV_ASSIGN_OR_RETURN(const uint64_t expected, ExpectedChunkBytes(header_, key));
  if (payload.size() != expected) {
    return Status::InvalidArgument("container writer: chunk " + format::DescribeChunk(key) +
                                   " has " + std::to_string(payload.size()) + " bytes, expected " +
                                   std::to_string(expected));
  }
  TQKV_RETURN_IF_ERROR(PadTo(format::AlignUp(written_, header_.payload_alignment)));
  ChunkEntry e = want.Entry();
  e.offset = written_;
  e.size = payload.size();
  e.checksum = format::Checksum(payload);
  TQKV_RETURN_IF_ERROR(Append(payload));
  entries_.push_back(e);
  sequence_.Advance();
  return Status::Ok();
}

Status ContainerWriterImpl::Finish() {
  TQKV_RETURN_IF_ERROR(CheckUsable());
  if (!sequence_.done()) {
    return Status::InvalidArgument(
        "container writer: missing chunks: " + std::to_string(entries_.size()) + " of " +
        std::to_string(expected_chunks_) + " written, next expected " +
        format::DescribeChunk(sequence_.current()));
  }
  // Index: u64 count, records, u64 checksum. It follows the last payload without padding.
  std::vector<uint8_t> index(format::kIndexFixedBytes +
                             entries_.size() * format::kIndexRecordBytes);
  format::StoreU64(index.data(), entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    format::EncodeIndexRecord(entries_[i], index.data() + 8 + i * format::kIndexRecordBytes);
  }
  const uint64_t index_checksum = format::Checksum({index.data(), index.size() - 8});
  format::StoreU64(index.data() + index.size() - 8, index_checksum);

  format::Footer f;
  f.index_offset = written_;
  f.index_size = index.size();
  f.index_checksum = index_checksum;
  f.file_size = written_ + index.size() + format::kFooterBytes;
  f.header_checksum = header_checksum_;
  f.format_version = ContainerVersionFor(header_);
  TQKV_RETURN_IF_ERROR(Append(index));
  TQKV_RETURN_IF_ERROR(Append(format::EncodeFooter(f)));
  finished_ = true;
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<ContainerWriter>> ContainerWriter::Create(WritableObject* out,
                                                                 const ContainerHeader& header) {
  if (out == nullptr) return Status::InvalidArgument("container writer: null output");
  TQKV_RETURN_IF_ERROR(format::ValidateHeader(header));
  TQKV_ASSIGN_OR_RETURN(const uint64_t chunks, format::CountChunks(header));
  auto w = std::make_unique<ContainerWriterImpl>(out, header, chunks);
  TQKV_RETURN_IF_ERROR(w->Start());
  return std::unique_ptr<ContainerWriter>(std::move(w));
}

}  // namespace tqkv
