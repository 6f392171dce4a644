// Registers the test schemes (throttle://) when the program loads. Linked only where they are
// wanted, as an object file (CMake: tqkv_testing_schemes): a static library would drop it.
#include "store/testing/store_testing.h"

namespace {

const bool kRegistered = [] {
  (void)tqkv::RegisterTestingStoreSchemes();  // no caller to tell at load; idempotent
  return true;
}();

}  // namespace
