// The settings of a checkpoint as every front end takes them from its user (the CLI, the Python
// package, llama.cpp sessions, the vLLM connector, bench): text, each unset field taking the
// library's default. ResolveCheckpointOptions is the one place those defaults are decided; the
// parsers below serve it and the tools that print settings back.
#ifndef TQKV_INCLUDE_TQKV_SETTINGS_H_
#define TQKV_INCLUDE_TQKV_SETTINGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tqkv/checkpoint.h"
#include "tqkv/codec.h"
#include "tqkv/status.h"

namespace tqkv {

// The codec of a session whose user names none: 3-bit TurboQuant (docs/accuracy.md).
inline constexpr std::string_view kDefaultCodec = "tq3";

struct CheckpointSettings {
  std::optional<std::string> codec;          // ParseKvCodecSpec; unset: kDefaultCodec
  std::vector<std::string> layer_codecs;     // "L:SPEC" overrides (ParseLayerCodec)
  std::optional<std::string> exact_tokens;   // "FIRST,LAST"; unset: DefaultExactTokens
  std::optional<std::string> key_means;      // ParseKeyMeans; unset: 128-token blocks, f16
  std::optional<bool> strict;                // unset: false (a guard breach only warns)
  std::optional<bool> guard;                 // unset: true (errors measured and stored)
  // Payload alignment in bytes, a power of two from 64 to 4096 (below 4096: format version 9,
  // for small sessions); unset: 4096.
  std::optional<uint64_t> alignment;
};

// The options a checkpoint with these settings runs with (codecs, exact rows, key means, guard,
// strictness, alignment); InvalidArgument naming the setting that does not parse. Pool, token block and
// engine state are the caller's.
Result<CheckpointOptions> ResolveCheckpointOptions(const CheckpointSettings& settings);

// The resolved settings back as text, the way a front end prints them (codec as given or the
// default, "FIRST,LAST", FormatKeyMeans).
struct ResolvedSettings {
  std::string codec;
  std::vector<std::string> layer_codecs;
  std::string exact_tokens;
  std::string key_means;
  bool strict = false;
  bool guard = true;
  uint32_t alignment = 4096;
};
ResolvedSettings DescribeSettings(const CheckpointSettings& settings,
                                  const CheckpointOptions& resolved);

// Sets codec, v_codec and allocate_bits from a plain, K/V or auto spec (ParseKvCodecSpec).
void SetCodec(CheckpointOptions& options, const KvCodecSpec& spec);

struct ExactTokens {
  uint32_t head = 0, tail = 0;
};
// Parses "FIRST,LAST" (e.g. "4,128") for CheckpointOptions::exact_head / exact_tail.
Result<ExactTokens> ParseExactTokens(std::string_view text);
// The default for lossy codecs: the last 4 tokens also stored exactly, which halves the mean KL
// of a restored llama.cpp session for +0.01-0.06 bits/value (docs/accuracy.md).
inline constexpr ExactTokens kDefaultExactTokens{0, 4};
// Whether some layer's K or V is stored by a lossy (TurboQuant) codec, or the allocator picks.
bool AnyLossyCodec(const CheckpointOptions& options);
// kDefaultExactTokens when AnyLossyCodec(options) (set the codecs first), else none.
ExactTokens DefaultExactTokens(const CheckpointOptions& options);

struct KeyMeanSetting {
  uint32_t block = kDefaultKeyMeanBlock;  // CheckpointOptions::key_mean_block
  DType dtype = DType::kF16;
};
// Parses "off" (or "0"), "session" or a block size in tokens, optionally followed by ",f16" or
// ",f32" (e.g. "128", "session,f32") for CheckpointOptions::key_mean_block / key_mean_dtype.
Result<KeyMeanSetting> ParseKeyMeans(std::string_view text);
// The inverse: "off", "session" or the block, with ",f32" when not f16.
std::string FormatKeyMeans(const KeyMeanSetting& setting);

// Parses "L:SPEC" (e.g. "0:tq4", "0:k4v2", "0:k:tq4/v:fp16") into a LayerCodec; SPEC as
// ParseKvCodecSpec.
Result<LayerCodec> ParseLayerCodec(std::string_view text);

}  // namespace tqkv

#endif  // TQKV_INCLUDE_TQKV_SETTINGS_H_
