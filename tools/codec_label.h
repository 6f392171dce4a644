// Human-readable names of stored codec parameters ("tq3", "tq2.5", "tq:b=3,rot=haar", "fp16").
#ifndef TQKV_TOOLS_CODEC_LABEL_H_
#define TQKV_TOOLS_CODEC_LABEL_H_

#include <string>

#include "tqkv/codec.h"

namespace tqkv::tools {
std::string CodecLabel(const CodecParams& params);
}  // namespace tqkv::tools

#endif  // TQKV_TOOLS_CODEC_LABEL_H_
