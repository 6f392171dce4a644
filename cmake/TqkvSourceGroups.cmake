# The files of a test module, of a program or of a library directory compile together, up to
# TQKV_GROUP_SIZE to a translation unit: the headers they share are then parsed, and their
# templates and inline code compiled, once per group instead of once per file. Tests: gtest's and
# the library's templates (the ten format tests: 51 -> 19 s of compiling at -O1, 79 -> 29 s under
# ASan + UBSan at -O0). The two programs: CLI11 2.1 and nlohmann/json, about 6.7 and 3.4 s of every
# file that includes them, at -O2 and under ASan at -O0 alike (a precompiled header saved 2 of the
# 6.7 s): 173 -> 59 s. The library: 239 -> 159 s at -O2, 402 -> 336 s under ASan. The group
# files include the sources by paths relative to a directory on the include path, so their text,
# and ccache's key, is the same in every clone. Names at a file's top level (anonymous namespaces
# included) must not repeat within its group's target.
set(TQKV_GROUP_SIZE 8 CACHE STRING "Source files per translation unit (1: each file alone)")

# tqkv_group_sources(OUT_VAR NAME BASE_DIR SRC...): OUT_VAR = the group files to compile; the
# sources stay listed in the target (HEADER_FILE_ONLY) for IDEs. BASE_DIR must be on the target's
# include path.
function(tqkv_group_sources out_var name base_dir)
  set(srcs ${ARGN})
  list(SORT srcs)
  list(LENGTH srcs n)
  if(TQKV_GROUP_SIZE LESS_EQUAL 1 OR n LESS_EQUAL 1)
    set(${out_var} ${srcs} PARENT_SCOPE)
    return()
  endif()
  math(EXPR groups "(${n} + ${TQKV_GROUP_SIZE} - 1) / ${TQKV_GROUP_SIZE}")
  set(i 0)
  foreach(src IN LISTS srcs)
    math(EXPR g "${i} % ${groups}")
    file(RELATIVE_PATH rel ${base_dir} ${src})
    string(APPEND text_${g} "#include \"${rel}\"\n")
    math(EXPR i "${i} + 1")
  endforeach()
  set(out ${srcs})
  set_source_files_properties(${srcs} PROPERTIES HEADER_FILE_ONLY ON)
  math(EXPR last "${groups} - 1")
  foreach(g RANGE ${last})
    set(file ${CMAKE_CURRENT_BINARY_DIR}/source_groups/${name}_${g}.cc)
    file(CONFIGURE OUTPUT ${file} CONTENT "${text_${g}}")  # rewritten only when it changes
    list(APPEND out ${file})
  endforeach()
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()

# tqkv_group_library_sources(OUT_VAR NAME BASE_DIR SRC...): a library's sources in groups of their
# own directory (file-local names then only need to differ within a directory); a source with
# compile options of its own (the SIMD kernels' -m flags, the sanitizer builds' exceptions) stays
# alone, since a group has one command line.
function(tqkv_group_library_sources out_var name base_dir)
  set(out "")
  set(dirs "")
  foreach(src IN LISTS ARGN)
    get_source_file_property(opts ${src} COMPILE_OPTIONS)
    if(opts)
      list(APPEND out ${src})
      continue()
    endif()
    get_filename_component(dir ${src} DIRECTORY)
    file(RELATIVE_PATH rel_dir ${base_dir} ${dir})
    string(MAKE_C_IDENTIFIER "${rel_dir}" key)
    list(APPEND dirs ${key})
    list(APPEND in_${key} ${src})
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  foreach(key IN LISTS dirs)
    tqkv_group_sources(grouped ${name}_${key} ${base_dir} ${in_${key}})
    list(APPEND out ${grouped})
  endforeach()
  set(${out_var} ${out} PARENT_SCOPE)
endfunction()
