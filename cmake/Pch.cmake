# Precompiled headers for clean builds (CHUNKATTN_PCH; cmake/Common.cmake).
#
# Most of a translation unit's front-end time is the same third-party headers
# (the standard library, Abseil, nlohmann/json, protobuf, gRPC, GoogleTest):
# parsed once per unity batch, 70-odd times per build folder. Here they are
# parsed once per folder and optimization level into a precompiled header
# that every C++ target of ours reuses (REUSE_FROM). An ASan -O0 batch of the
# OpenAI front's tests compiles in 14 s instead of 19.5, the gRPC front's in
# 14 instead of 18.
#
# clang refuses a precompiled header built with another optimization level,
# thread model or fuzzer coverage, so there is one carrier target per level a
# target compiles at (its CHUNKATTN_OPT property: O0 or O2 where
# cmake/Common.cmake and the top-level CMakeLists.txt set one, else the
# folder's) with and without the fuzzers' coverage (CHUNKATTN_FUZZ_INSTRUMENTED,
# tests/fuzz/CMakeLists.txt), and every user and carrier compiles with
# -pthread and GoogleTest's GTEST_HAS_PTHREAD=1 (its tests' definition, which
# must match the header's). Left out: the kernels (they build alone
# too, without these libraries, and some files carry -mavx2), the generated
# protobuf code and the TSan build's Abseil (their own options), the sampler
# (-ffp-contract=off, which a precompiled header must match), shared
# libraries (-fPIC), targets with no C++ sources, and anything imported.

set(CHUNKATTN_PCH_HEADERS
  <algorithm> <atomic> <cstdint> <deque> <functional> <map> <memory> <mutex> <optional> <set>
  <string> <thread> <unordered_map> <utility> <variant> <vector>
  [["absl/container/flat_hash_map.h"]] [["absl/status/status.h"]] [["absl/status/statusor.h"]]
  [["absl/strings/match.h"]] [["absl/strings/str_cat.h"]] [["absl/strings/str_format.h"]]
  [["absl/strings/str_split.h"]] [["absl/synchronization/mutex.h"]] [["absl/time/clock.h"]]
  [["absl/time/time.h"]] [["absl/types/span.h"]]
  [["nlohmann/json.hpp"]] [["google/protobuf/message.h"]] [["grpcpp/grpcpp.h"]] [["gtest/gtest.h"]])

# Every target defined under `dir`, depth first.
function(_chunkattn_targets_under dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    _chunkattn_targets_under("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(chunkattn_precompiled_headers)
  if(NOT CHUNKATTN_PCH)
    return()
  endif()
  _chunkattn_targets_under("${CMAKE_SOURCE_DIR}" targets)
  set(carriers "")
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(STATIC_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$" OR target MATCHES "^chunkattn_kernels"
       OR target MATCHES "^chunkattn_(proto|pch_.*|tsan_absl|sampler)$")
      continue()
    endif()
    get_target_property(dir ${target} SOURCE_DIR)
    if(dir MATCHES "^${CHUNKATTN_ROOT}/kernels(/|$)")
      continue()
    endif()
    get_target_property(sources ${target} SOURCES)
    list(FILTER sources INCLUDE REGEX "\\.(cc|cpp|cxx)$")
    if(NOT sources)
      continue()
    endif()
    get_target_property(level ${target} CHUNKATTN_OPT)
    if(NOT level)
      set(level ${CHUNKATTN_DEFAULT_OPT})
    endif()
    if(NOT level)
      set(level default)
    endif()
    get_property(fuzzed TARGET ${target} PROPERTY CHUNKATTN_FUZZ_INSTRUMENTED)  # tests/fuzz/CMakeLists.txt
    if(fuzzed)
      set(level ${level}_fuzz)
    endif()
    set(carrier chunkattn_pch_${level})
    if(NOT level IN_LIST carriers)
      list(APPEND carriers ${level})
      # Defined in the top folder: its options are the ones every target
      # starts from (sanitizers, -O0 of CHUNKATTN_OPTIMIZE=hot, debug info).
      file(WRITE "${CMAKE_BINARY_DIR}/pch/${level}.cc" "// carries the precompiled header (cmake/Pch.cmake)\n")
      add_library(${carrier} STATIC "${CMAKE_BINARY_DIR}/pch/${level}.cc")
      set_target_properties(${carrier} PROPERTIES UNITY_BUILD OFF)
      target_compile_options(${carrier} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-pthread>)
      target_compile_definitions(${carrier} PRIVATE GTEST_HAS_PTHREAD=1)
      if(level MATCHES "^(O[0-9])")
        target_compile_options(${carrier} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-${CMAKE_MATCH_1}>)
      endif()
      if(level MATCHES "_fuzz$")
        target_compile_options(${carrier} PRIVATE -fsanitize=fuzzer-no-link)
      endif()
      target_precompile_headers(${carrier} PRIVATE ${CHUNKATTN_PCH_HEADERS})
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-pthread>)
    target_compile_definitions(${target} PRIVATE GTEST_HAS_PTHREAD=1)
    target_precompile_headers(${target} REUSE_FROM ${carrier})
  endforeach()
endfunction()
