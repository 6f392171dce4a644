// The rule every restore applies before it writes a byte: a destination matches the session it is
// asked to hold (tensors for every layer, the stored geometry and token count, a layout inside the
// caller's arrays). Host and device restores share it, so a cache that does not match its request
// is refused the same way wherever it is going.
#ifndef TQKV_SRC_CHECKPOINT_DESTINATION_H_
#define TQKV_SRC_CHECKPOINT_DESTINATION_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "tqkv/container.h"
#include "tqkv/kv_cache.h"
#include "tqkv/kv_layout.h"
#include "tqkv/status.h"

namespace tqkv {

// InvalidArgument unless the stored geometry is `want`; `what` names the session.
Status CheckGeometry(const ContainerHeader& h, const ModelGeometry& want, const std::string& what);
// Unsupported for a ragged session (format version 7: layers of different token counts) with
// `what` (e.g. "a restore into layout tensors"), which needs one token count for every layer.
Status RefuseRagged(const ContainerHeader& h, std::string_view what);
// InvalidArgument unless the session holds exactly `room` tokens; Unsupported when it is ragged
// (every layout and device destination has one token count for all layers).
Status CheckTokens(const ContainerHeader& h, uint64_t room, std::string_view key);
// A KvCache destination: the stored tokens, and every layer's own count (LayerTokens) when the
// session is ragged; InvalidArgument naming the first difference.
Status CheckCacheTokens(const ContainerHeader& h, const KvCache& dst, std::string_view key);
// Before the header is known: one K and one V tensor per layer, none null, and every element of
// dst.tokens tokens inside dst.tensor_elems (ValidateKvLayout).
Status CheckDestinationShape(const LayoutTensors& dst, std::string_view key);
// All of the above against the stored header.
Status CheckDestination(const LayoutTensors& dst, const ContainerHeader& h, std::string_view key);

}  // namespace tqkv

#endif  // TQKV_SRC_CHECKPOINT_DESTINATION_H_
