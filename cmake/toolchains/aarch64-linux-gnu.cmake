# Cross build for 64-bit Arm Linux with Debian's cross toolchain (g++-aarch64-linux-gnu); the
# binaries run here under qemu user-mode emulation (qemu-user-static), which ctest uses too.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Headers and libraries from the target's sysroot only, never the host's /usr.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

find_program(TQKV_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(TQKV_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${TQKV_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()
