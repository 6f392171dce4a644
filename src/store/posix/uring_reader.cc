#include "store/posix/uring_reader.h"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "tqkv/aligned_buffer.h"

namespace tqkv::posix_internal {

struct UringReader::Impl {
  io_uring ring{};
  uint32_t queue_depth = 0;
  size_t bounce_bytes = 0;
  std::vector<AlignedBuffer> bounce;  // one per slot, allocated on first use
  bool ring_up = false;

  ~Impl() {
    if (ring_up) io_uring_queue_exit(&ring);
  }
};

Result<std::unique_ptr<UringReader>> UringReader::Create(uint32_t queue_depth,
                                                         size_t bounce_bytes) {
  if (queue_depth == 0 || queue_depth > 4096) {
    return Status::InvalidArgument("io_uring queue depth " + std::to_string(queue_depth) +
                                   " out of range [1, 4096]");
  }
  auto impl = std::make_unique<Impl>();
  const int rc = io_uring_queue_init(queue_depth, &impl->ring, 0);
  if (rc < 0) {
    return Status::FromErrno("io_uring_queue_init", "qd=" + std::to_string(queue_depth), -rc);
  }
  impl->ring_up = true;
  impl->queue_depth = queue_depth;
  impl->bounce_bytes = bounce_bytes;
  impl->bounce.resize(queue_depth);
  return std::unique_ptr<UringReader>(new UringReader(std::move(impl)));
}

UringReader::UringReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UringReader::~UringReader() = default;

Status UringReader::Run(int fd, std::span<const UringPiece> pieces, std::string_view name,
                        std::vector<size_t>* retry, uint64_t* bytes_moved) {
  Impl& im = *impl_;
  constexpr size_t kNoPiece = static_cast<size_t>(-1);
  std::vector<size_t> slot_piece(im.queue_depth, kNoPiece);
  std::vector<uint32_t> free_slots;
  free_slots.reserve(im.queue_depth);
  for (uint32_t s = im.queue_depth; s > 0; --s) free_slots.push_back(s - 1);

  Status first_error;
  size_t next = 0;
  uint32_t in_flight = 0;
  bool submit_broken = false;

  auto prepare = [&](uint32_t slot, size_t idx) -> bool {
    io_uring_sqe* sqe = io_uring_get_sqe(&im.ring);
    if (sqe == nullptr) return false;
    const UringPiece& p = pieces[idx];
    if (p.bounce) {
      AlignedBuffer& buf = im.bounce[slot];
      if (buf.size() < im.bounce_bytes) buf.Reserve(im.bounce_bytes);
      io_uring_prep_read(sqe, fd, buf.data(), p.io_len, p.io_off);
    } else {
      io_uring_prep_read(sqe, fd, p.dst, p.len, p.off);
    }
    io_uring_sqe_set_data64(sqe, slot);
    slot_piece[slot] = idx;
    return true;
  };

  while (next < pieces.size() || in_flight > 0) {
    while (first_error.ok() && next < pieces.size() && !free_slots.empty()) {
      const uint32_t slot = free_slots.back();
      if (!prepare(slot, next)) break;
      free_slots.pop_back();
      ++next;
      ++in_flight;
    }
    if (in_flight == 0) break;  // stopped by an error with nothing left in flight
    if (!submit_broken) {
      // Submits whatever is queued (possibly nothing) and waits for one completion.
      const int rc = io_uring_submit_and_wait(&im.ring, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) {
        // Stop submitting. Requests that never reached the kernel stay in the submission queue
        // (so the caller must destroy this reader after the error); wait for the others.
        if (first_error.ok()) first_error = Status::FromErrno("io_uring_submit", name, -rc);
        submit_broken = true;
        in_flight -= std::min(in_flight, io_uring_sq_ready(&im.ring));
        if (in_flight == 0) break;
      }
    } else {
      io_uring_cqe* wait = nullptr;
      // Requests the kernel holds write into caller buffers: returning before they complete is
      // not an option, so errors here only retry.
      (void)io_uring_wait_cqe(&im.ring, &wait);
    }

    io_uring_cqe* cqe = nullptr;
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(&im.ring, head, cqe) {
      ++seen;
      const uint32_t slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      const size_t idx = slot_piece[slot];
      const UringPiece& p = pieces[idx];
      bool release = true;
      if (res == -EAGAIN || res == -EINTR) {
        if (first_error.ok()) {
          // Resubmit the same piece in the same slot (after this CQE batch is consumed).
          release = !prepare(slot, idx);
          if (release) retry->push_back(idx);
        } else {
          retry->push_back(idx);
        }
      } else if (res == -EINVAL) {
        retry->push_back(idx);  // O_DIRECT refused: the caller falls back
      } else if (res < 0) {
        if (first_error.ok()) {
          first_error = Status::FromErrno(
              "io_uring read", std::string(name) + " at offset " + std::to_string(p.off), -res);
        }
      } else {
        *bytes_moved += static_cast<uint64_t>(res);
        if (p.bounce) {
          const uint64_t skip = p.off - p.io_off;
          if (static_cast<uint64_t>(res) < skip + p.len) {
            retry->push_back(idx);
          } else {
            std::memcpy(p.dst, im.bounce[slot].data() + skip, p.len);
          }
        } else if (static_cast<uint32_t>(res) < p.len) {
          retry->push_back(idx);
        }
      }
      if (release) {
        slot_piece[slot] = kNoPiece;
        free_slots.push_back(slot);
        --in_flight;
      }
    }
    io_uring_cq_advance(&im.ring, seen);
  }
  return first_error;
}

}  // namespace tqkv::posix_internal
