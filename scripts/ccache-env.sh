# Sourced from the repository root by build.sh and test.sh: compile through ccache when it is
# installed, with paths taken relative to the repository, so a fresh clone hits an earlier clone's
# cache and the pip build of the Python test (the same flags, pyproject.toml) the plain build's.
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  # A miss compiles once: the compiler's own dependency file (-MD, which CMake's Ninja builds pass)
  # lists the headers, where ccache would otherwise run the preprocessor first.
  export CCACHE_DEPEND=1
fi
