// Where the tests find the source tree and the build tree. Defined in one translation unit
// (test_paths.cc) so that no other test file's compile command names a directory: a fresh clone
// elsewhere then hits ccache for every other test file.
#ifndef TQKV_TESTS_TEST_PATHS_H_
#define TQKV_TESTS_TEST_PATHS_H_

#include <string>

namespace tqkv::test {

const std::string& SourceDir();  // the repository root
const std::string& BinaryDir();  // the CMake build directory (tqkv, tqkv-bench, test-tmp/)

}  // namespace tqkv::test

#endif  // TQKV_TESTS_TEST_PATHS_H_
