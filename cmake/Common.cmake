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
# libFuzzer harnesses (fuzz/): every target gets coverage instrumentation, the
# harnesses link libFuzzer's main. Clang only.
option(CHUNKATTN_FUZZ "Build the libFuzzer harnesses in fuzz/ (clang)" OFF)
if(CHUNKATTN_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# chunkattn_test(NAME SOURCES... LIBS ... [TSAN] [PROPERTIES ...]): a
# GoogleTest binary registered with ctest, labelled "unit" (the sanitizer
# builds run those), or "unit_tsan" with TSAN (the thread sanitizer's
# build runs those too; ctest -L takes a regular expression). One label:
# gtest_discover_tests cannot pass a list as a property value.
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
function(chunkattn_register_unit_test name)
  cmake_parse_arguments(ARG "TSAN" "" "PROPERTIES" ${ARGN})
  set(label unit)
  if(ARG_TSAN)
    set(label unit_tsan)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS ${label} ${ARG_PROPERTIES})
  set_property(GLOBAL APPEND PROPERTY CHUNKATTN_UNIT_TESTS ${name})
endfunction()
