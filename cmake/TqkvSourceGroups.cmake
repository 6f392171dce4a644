# A test module's files compile together, up to TQKV_TEST_GROUP_SIZE to a translation unit: gtest's
# and the library's templates are then instantiated once per group instead of once per file (the
# ten format tests: 51 -> 19 s of compiling at -O1, 79 -> 29 s under ASan + UBSan at -O0). The
# group files include the tests by paths relative to tests/, so their text, and ccache's key, is
# the same in every clone. Names at a test file's top level must not repeat within its module.
set(TQKV_TEST_GROUP_SIZE 8 CACHE STRING "Test files per translation unit (1: each file alone)")

# tqkv_test_groups(OUT_VAR MODULE TESTS_DIR SRC...): OUT_VAR = the group files to compile; the
# sources stay listed in the target (HEADER_FILE_ONLY) for IDEs.
function(tqkv_test_groups out_var module tests_dir)
  set(srcs ${ARGN})
  list(SORT srcs)
  list(LENGTH srcs n)
  if(TQKV_TEST_GROUP_SIZE LESS_EQUAL 1 OR n LESS_EQUAL 1)
    set(${out_var} ${srcs} PARENT_SCOPE)
    return()
  endif()
  math(EXPR groups "(${n} + ${TQKV_TEST_GROUP_SIZE} - 1) / ${TQKV_TEST_GROUP_SIZE}")
  set(i 0)
  foreach(src IN LISTS srcs)
    math(EXPR g "${i} % ${groups}")
    file(RELATIVE_PATH rel ${tests_dir} ${src})
    string(APPEND text_${g} "#include \"${rel}\"\n")
    math(EXPR i "${i} + 1")
  endforeach()
  set(out ${srcs})
  set_source_files_properties(${srcs} PROPERTIES HEADER_FILE_ONLY ON)
  math(EXPR last "${groups} - 1")
  foreach(g RANGE ${last})
    set(file ${CMAKE_CURRENT_BINARY_DIR}/test_groups/${module}_${g}.cc)
    file(CONFIGURE OUTPUT ${file} CONTENT "${text_${g}}")  # rewritten only when it changes
    list(APPEND out ${file})
  endforeach()
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()
