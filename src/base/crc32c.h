// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord files
// (TensorBoard event files) and of iSCSI (RFC 3720). crc32c("123456789") = 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace omni {

// Continues a CRC: crc32c(b, crc32c(a)) == crc32c(a + b).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view bytes, uint32_t crc = 0) {
  return crc32c(bytes.data(), bytes.size(), crc);
}

// TFRecord's masked CRC: a CRC stored next to the data it covers is rotated and offset, so
// that computing the CRC of a string that itself contains CRCs stays well distributed.
constexpr uint32_t mask_crc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace omni
