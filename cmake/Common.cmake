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

# clang links with LLVM's lld where it is installed (scripts/install-deps.sh
# installs it for the clang builds): it links a sanitized test binary 5x
# faster than GNU ld (chunkattn_openai_test: 0.8 against 4.3 s). Only where
# the C++ compiler drives the link: nvcc drives none here, but would not
# take the flag.
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  find_program(CHUNKATTN_LLD NAMES ld.lld ld.lld-14)
  if(CHUNKATTN_LLD)
    add_link_options($<$<LINK_LANGUAGE:CXX>:-fuse-ld=lld>)
  endif()
endif()

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
  # The define is an option, not a compile definition, so that a target
  # that replaces its options (the generated protobuf code) sheds it too.
  add_compile_options(-fsanitize=${CHUNKATTN_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer
                      -DCHUNKATTN_SANITIZER_BUILD=1)
  add_link_options(-fsanitize=${CHUNKATTN_SANITIZE})
endif()
# What compiles optimized: "all" (the build type's level, the default) or
# "hot": -O0 but for the libraries whose code the tests run hot (the list in
# the top-level CMakeLists.txt) and the HEAVY tests. The sanitizer builds are
# always "hot": ASan + UBSan at -O2 doubles a file's compile (the text
# library's batch: 62 against 31 s), and most code under test runs little
# there. CI's main folder asks for it too (scripts/test.sh): its tests' time
# goes to the model, the kernels, the cache and the tokenizer, and -O0 halves
# the compile of the rest (the fronts, the coordinator, the tools). A served
# build keeps "all".
set(CHUNKATTN_OPTIMIZE all CACHE STRING "What compiles optimized: all, or hot (the hot libraries only)")
set_property(CACHE CHUNKATTN_OPTIMIZE PROPERTY STRINGS all hot)
if(CHUNKATTN_SANITIZE)
  set(CHUNKATTN_OPTIMIZE hot CACHE STRING "" FORCE)
endif()
if(CHUNKATTN_OPTIMIZE STREQUAL "hot")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-O0>)
  set(CHUNKATTN_DEFAULT_OPT O0)  # cmake/Pch.cmake
elseif(NOT CHUNKATTN_OPTIMIZE STREQUAL "all")
  message(FATAL_ERROR "CHUNKATTN_OPTIMIZE must be all or hot, not ${CHUNKATTN_OPTIMIZE}")
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
# Unity builds: each target's C++ sources compiled in batches of up to 16
# files as one translation unit, so the headers they share (Abseil, gRPC,
# GoogleTest, nlohmann/json) are parsed and their templates instantiated
# once per batch rather than once per file. For clean builds (CI's, through
# scripts/test.sh); an edit recompiles its whole batch, so a working folder
# is better off without. Files that cannot share a unit say so with
# SKIP_UNITY_BUILD_INCLUSION or the target's UNITY_BUILD property.
option(CHUNKATTN_UNITY "Unity builds (batches of 16 files per translation unit)" OFF)
if(CHUNKATTN_UNITY)
  set(CMAKE_UNITY_BUILD ON)
  set(CMAKE_UNITY_BUILD_BATCH_SIZE 16)
endif()
# libFuzzer harnesses (tests/fuzz/, clang only). Coverage instrumentation
# (-fsanitize=fuzzer-no-link) goes on the harnesses and the libraries they
# link, not on every target: tests/fuzz/CMakeLists.txt says why.
# Precompiled third-party headers (cmake/Pch.cmake), for clean builds like
# unity batches: on with them under clang (CI's three folders) unless asked
# otherwise.
set(_chunkattn_pch OFF)
if(CHUNKATTN_UNITY AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(_chunkattn_pch ON)
endif()
option(CHUNKATTN_PCH "Precompile the third-party headers every target includes" ${_chunkattn_pch})
include(${CMAKE_CURRENT_LIST_DIR}/Pch.cmake)
option(CHUNKATTN_FUZZ "Build the libFuzzer harnesses in tests/fuzz/ (clang)" OFF)

# Whether a plain (unsanitized) build builds and registers the unit tests the
# sanitizer builds run too (every GoogleTest binary but the CUDA ones).
# scripts/test.sh turns it off in the main folder it creates when the
# sanitizer builds run, as in CI: each unit test then runs once, under ASan +
# UBSan (and TSan where marked TSAN), and no test file is compiled a third
# time by gcc. A developer's folder keeps them (the default).
option(CHUNKATTN_SANITIZED_UNIT_TESTS "Plain builds also build and run the unit tests the sanitizer builds run" ON)

# chunkattn_test(NAME SOURCES... LIBS ... [TSAN] [HEAVY] [CUDA] [PROPERTIES ...]): a
# GoogleTest binary registered with ctest, labelled "unit" (the sanitizer
# builds run those), or "unit_tsan" with TSAN (the thread sanitizer's
# build runs those too; ctest -L takes a regular expression). A test's own
# C++ files compile at -O0, the code under test (the libraries) keeping the
# build type's optimization: clang with ASan + UBSan compiles a test file
# about 3x faster at -O0 (kv_events_test.cc: 9 vs 28 s). HEAVY marks a test
# whose own files do much of the work (random walks against brute-force
# models, float64 oracles): those stay optimized, as at -O0 they ran 1.7-3.3x
# longer under ASan (chunkattn_cache_test 98 -> 328 s). One label:
# gtest_discover_tests cannot pass a list as a property value. The top-level
# targets unit_tests and tsan_tests build each group (CMakeLists.txt).
function(chunkattn_test name)
  cmake_parse_arguments(ARG "TSAN;HEAVY;CUDA" "" "SOURCES;LIBS;PROPERTIES" ${ARGN})
  if(NOT BUILD_TESTING)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  set(flags "")
  if(ARG_TSAN)
    list(APPEND flags TSAN)
  endif()
  if(ARG_HEAVY)
    list(APPEND flags HEAVY)
  endif()
  if(ARG_CUDA)
    list(APPEND flags CUDA)
  endif()
  chunkattn_register_unit_test(${name} ${flags} PROPERTIES ${ARG_PROPERTIES})
endfunction()

# Registers an existing GoogleTest executable as chunkattn_test does, and
# compiles its files as chunkattn_test does (-O0 unless HEAVY).
# In the sanitizer builds the binary is one ctest test, all its TESTs in one
# process, rather than one process per TEST: a sanitized process is slow to
# start, about 0.4 s each under ASan (the 141 TESTs of the cache and CPU kernel
# tests took 216 core-seconds as 141 processes, 161 as two), and the unit
# tests are ~540 TESTs. Per-TEST TIMEOUTs do not fit a whole binary: 900 s.
# CUDA marks a test built only where CUDA is, which the sanitizer builds never
# are: with CHUNKATTN_SANITIZED_UNIT_TESTS off, the only kind a plain build
# keeps. A CUDA binary is one ctest test too, in every build: its process
# loads cuBLAS, cuBLASLt and NCCL at start (0.5 CPU-s, against 0.05 for a
# binary without them), and CI's main folder ran its 111 TESTs, nearly all
# skipping without a GPU, as 111 processes.
function(chunkattn_register_unit_test name)
  cmake_parse_arguments(ARG "TSAN;HEAVY;CUDA" "" "PROPERTIES" ${ARGN})
  if(NOT CHUNKATTN_SANITIZE AND NOT CHUNKATTN_SANITIZED_UNIT_TESTS AND NOT ARG_CUDA)
    set_target_properties(${name} PROPERTIES EXCLUDE_FROM_ALL TRUE)
    return()
  endif()
  if(NOT ARG_HEAVY)
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
    set_target_properties(${name} PROPERTIES CHUNKATTN_OPT O0)  # cmake/Pch.cmake
  elseif(CHUNKATTN_OPTIMIZE STREQUAL "hot")
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O2>)
    set_target_properties(${name} PROPERTIES CHUNKATTN_OPT O2)
  endif()
  set(label unit)
  if(ARG_TSAN)
    set(label unit_tsan)
  endif()
  if(CHUNKATTN_SANITIZE OR ARG_CUDA)
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
