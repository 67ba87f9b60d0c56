# Finds every third-party dependency once, so the layer CMakeLists only name targets.
#
#   Python3      interpreter + module development files (the extension's ABI)
#   Torch        LibTorch from the installed torch wheel (torch.utils.cmake_prefix_path);
#                compile definitions such as _GLIBCXX_USE_CXX11_ABI come from it, never by hand
#   torch_python torch's Python binding library, for the tensor casters of torch/csrc/utils/pybind.h
#   pybind11     torch's bundled copy (torch/include/pybind11): two pybind11 versions in one
#                process break type casting, so we never use another one
#   spdlog/fmt   Debian's (or staged) spdlog, used header-only and only by src/common/log.cpp;
#                no translation unit that sees torch's bundled fmt ever sees this one
#   CUDA         optional: NVRTC and the driver API when the toolkit is present
#   GTest        only with MAGI_BUILD_TESTS

find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE MAGI_TORCH_CMAKE_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _magi_torch_rc)
if(NOT _magi_torch_rc EQUAL 0)
  message(FATAL_ERROR "magi-compiler: `import torch` failed with ${Python3_EXECUTABLE}. "
                      "Install torch first, then build with `pip install --no-build-isolation .`")
endif()
list(APPEND CMAKE_PREFIX_PATH "${MAGI_TORCH_CMAKE_PREFIX}")

include(CheckLanguage)
check_language(CUDA)
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(MAGI_HAVE_CUDA ON)
  message(STATUS "magi-compiler: CUDA toolkit ${CUDAToolkit_VERSION} found; GPU parts enabled")
else()
  set(MAGI_HAVE_CUDA OFF)
  message(STATUS "magi-compiler: no CUDA toolkit; building the CPU-only core")
endif()

# TorchConfig prints a warning about kineto for wheels; it is harmless.
find_package(Torch REQUIRED)
get_filename_component(MAGI_TORCH_ROOT "${MAGI_TORCH_CMAKE_PREFIX}/../.." ABSOLUTE)
find_library(MAGI_TORCH_PYTHON_LIBRARY torch_python PATHS "${MAGI_TORCH_ROOT}/lib" NO_DEFAULT_PATH
             REQUIRED)

# LibTorch as one interface target: include dirs, definitions and libraries from find_package.
add_library(magi_torch INTERFACE)
target_include_directories(magi_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_link_libraries(magi_torch INTERFACE ${TORCH_LIBRARIES})
target_compile_options(magi_torch INTERFACE ${TORCH_CXX_FLAGS})

# spdlog and fmt, header-only (FMT_HEADER_ONLY), so the built extension needs no libfmt or
# libspdlog at run time. Found in the system include path or under MAGI_DEPS_DIR.
find_path(MAGI_SPDLOG_INCLUDE_DIR spdlog/spdlog.h HINTS "${MAGI_DEPS_DIR}/include"
          "$ENV{MAGI_DEPS_DIR}/include")
find_path(MAGI_FMT_INCLUDE_DIR fmt/format.h HINTS "${MAGI_DEPS_DIR}/include"
          "$ENV{MAGI_DEPS_DIR}/include")
if(NOT MAGI_SPDLOG_INCLUDE_DIR OR NOT MAGI_FMT_INCLUDE_DIR)
  message(FATAL_ERROR "magi-compiler needs spdlog and fmt headers: `apt-get install libspdlog-dev` "
                      "or pass -DMAGI_DEPS_DIR=<prefix with include/spdlog and include/fmt>")
endif()
add_library(magi_spdlog INTERFACE)
target_include_directories(magi_spdlog SYSTEM INTERFACE ${MAGI_SPDLOG_INCLUDE_DIR}
                                                        ${MAGI_FMT_INCLUDE_DIR})
target_compile_definitions(magi_spdlog INTERFACE SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY)

# Warnings for our own code only.
add_library(magi_warnings INTERFACE)
target_compile_options(magi_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)
