# Settings shared by the top-level build and by kernels/ built alone.
include_guard(GLOBAL)

set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()

get_filename_component(CHUNKATTN_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
endif()

# CUDA is optional. AUTO builds kernels/cuda when nvcc is found.
set(CHUNKATTN_CUDA "AUTO" CACHE STRING "Build the CUDA kernels: AUTO, ON or OFF")
set_property(CACHE CHUNKATTN_CUDA PROPERTY STRINGS AUTO ON OFF)
set(CHUNKATTN_CUDA_ARCHITECTURES "80;90a" CACHE STRING "CUDA architectures to build for")
set(CHUNKATTN_WITH_CUDA OFF)
if(NOT CHUNKATTN_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES "${CHUNKATTN_CUDA_ARCHITECTURES}")
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(CHUNKATTN_WITH_CUDA ON)
  elseif(CHUNKATTN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CHUNKATTN_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "chunkattn: CUDA kernels ${CHUNKATTN_WITH_CUDA} (architectures ${CHUNKATTN_CUDA_ARCHITECTURES})")

find_package(absl CONFIG REQUIRED)
find_package(Threads REQUIRED)

include(CTest)
if(BUILD_TESTING)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wall> $<$<COMPILE_LANGUAGE:CXX>:-Wextra>)

# Sanitizer builds (scripts/sanitize.sh configures them with clang, CUDA off):
# "address,undefined" or "thread". Any report fails the process.
set(CHUNKATTN_SANITIZE "" CACHE STRING "Sanitizers for every target: address,undefined or thread")
if(CHUNKATTN_SANITIZE)
  add_compile_options(-fsanitize=${CHUNKATTN_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${CHUNKATTN_SANITIZE})
  add_compile_definitions(CHUNKATTN_SANITIZER_BUILD=1)
endif()
# Debug information: "full" (-g, as the build type gives it) or "lines" (line
# tables and function names: what a backtrace, gdb's `bt` and a sanitizer
# report need, without variables and types). "lines" compiles 29% faster
# with gcc and 11% faster with clang (CPU time of four and six of the heavier
# files, 2-core VM): the sanitizer builds default to it, and CI's main build
# asks for it (scripts/test.sh). Affects C++ only, not nvcc.
if(CHUNKATTN_SANITIZE)
  set(_chunkattn_debug_info lines)
else()
  set(_chunkattn_debug_info full)
endif()
set(CHUNKATTN_DEBUG_INFO "${_chunkattn_debug_info}" CACHE STRING "Debug information: full or lines")
set_property(CACHE CHUNKATTN_DEBUG_INFO PROPERTY STRINGS full lines)
if(CHUNKATTN_DEBUG_INFO STREQUAL "lines")
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-gline-tables-only>)
  else()
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-g1>)
  endif()
elseif(NOT CHUNKATTN_DEBUG_INFO STREQUAL "full")
  message(FATAL_ERROR "CHUNKATTN_DEBUG_INFO must be full or lines, not ${CHUNKATTN_DEBUG_INFO}")
endif()
# libFuzzer harnesses (tests/fuzz/, clang only). Coverage instrumentation
# (-fsanitize=fuzzer-no-link) goes on the harnesses and the libraries they
# link, not on every target: tests/fuzz/CMakeLists.txt says why.
option(CHUNKATTN_FUZZ "Build the libFuzzer harnesses in tests/fuzz/ (clang)" OFF)

# chunkattn_test(NAME SOURCES... LIBS ... [TSAN] [PROPERTIES ...]): a
# GoogleTest binary registered with ctest, labelled "unit" (the sanitizer
# builds run those), or "unit_tsan" with TSAN (the thread sanitizer's
# build runs those too; ctest -L takes a regular expression). One label:
# gtest_discover_tests cannot pass a list as a property value. The top-level
# targets unit_tests and tsan_tests build each group (CMakeLists.txt).
function(chunkattn_test name)
  cmake_parse_arguments(ARG "TSAN" "" "SOURCES;LIBS;PROPERTIES" ${ARGN})
  if(NOT BUILD_TESTING)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  set(tsan "")
  if(ARG_TSAN)
    set(tsan TSAN)
  endif()
  chunkattn_register_unit_test(${name} ${tsan} PROPERTIES ${ARG_PROPERTIES})
endfunction()

# Registers an existing GoogleTest executable as chunkattn_test does.
# In the sanitizer builds the binary is one ctest test, all its TESTs in one
# process, rather than one process per TEST: a sanitized process is slow to
# start, about 0.4 s each under ASan (the 141 TESTs of the cache and CPU kernel
# tests took 216 core-seconds as 141 processes, 161 as two), and the unit
# tests are ~540 TESTs. Per-TEST TIMEOUTs do not fit a whole binary: 900 s.
function(chunkattn_register_unit_test name)
  cmake_parse_arguments(ARG "TSAN" "" "PROPERTIES" ${ARGN})
  set(label unit)
  if(ARG_TSAN)
    set(label unit_tsan)
  endif()
  if(CHUNKATTN_SANITIZE)
    add_test(NAME ${name} COMMAND ${name})
    set(props LABELS ${label} TIMEOUT 900)
    list(LENGTH ARG_PROPERTIES n)
    if(n GREATER 0)
      math(EXPR last "${n} - 2")
      foreach(i RANGE 0 ${last} 2)
        math(EXPR j "${i} + 1")
        list(GET ARG_PROPERTIES ${i} key)
        list(GET ARG_PROPERTIES ${j} value)
        if(NOT key STREQUAL "TIMEOUT")
          list(APPEND props ${key} "${value}")
        endif()
      endforeach()
    endif()
    set_tests_properties(${name} PROPERTIES ${props})
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS ${label} ${ARG_PROPERTIES})
  endif()
  set_property(GLOBAL APPEND PROPERTY CHUNKATTN_UNIT_TESTS ${name})
  if(ARG_TSAN)
    set_property(GLOBAL APPEND PROPERTY CHUNKATTN_TSAN_TESTS ${name})
  endif()
endfunction()
