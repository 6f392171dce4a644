# SIMD kernel files are named for their instruction set (*_avx2.cc, *_neon.cc) and compiled only
# for targets of that architecture; the dispatchers check the same architecture macros.
function(tqkv_drop_foreign_simd_sources list_var)
  set(srcs ${${list_var}})
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    list(FILTER srcs EXCLUDE REGEX "_avx[0-9]*\\.cc$")
  endif()
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
    list(FILTER srcs EXCLUDE REGEX "_neon\\.cc$")
  endif()
  set(${list_var} ${srcs} PARENT_SCOPE)
endfunction()
