// Redis Cluster hash slots: CRC16 (XMODEM: poly 0x1021, init 0) of the key's hash tag, mod 16384.
// The hash tag is the text between the first '{' and the first '}' after it, when non-empty;
// else the whole key (Redis Cluster specification, "Hash tags"). Header-only: tests use it
// without linking hiredis.
#ifndef TQKV_SRC_STORE_REDIS_REDIS_SLOT_H_
#define TQKV_SRC_STORE_REDIS_REDIS_SLOT_H_

#include <cstdint>
#include <string_view>

namespace tqkv::redis {

inline constexpr int kClusterSlots = 16384;

constexpr uint16_t Crc16Xmodem(std::string_view data) {
  uint16_t crc = 0;
  for (char ch : data) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(ch)) << 8;
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

constexpr std::string_view HashTag(std::string_view key) {
  const size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const size_t close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

constexpr int KeySlot(std::string_view key) { return Crc16Xmodem(HashTag(key)) % kClusterSlots; }

static_assert(Crc16Xmodem("123456789") == 0x31C3, "CRC16/XMODEM check value");

}  // namespace tqkv::redis

#endif  // TQKV_SRC_STORE_REDIS_REDIS_SLOT_H_
