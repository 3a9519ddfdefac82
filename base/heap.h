// Gives the allocator's free pages back to the kernel. glibc keeps the pages
// of freed blocks inside its heaps (only the top of each heap is trimmed on
// free), so after a burst (a queue of long prompts, a worker's restart) a
// server's RSS stays at its peak long after the memory is free: operators
// read that as a leak, and a container limit counts it. A server calls this
// when it goes idle after work, at most every few seconds: malloc_trim(0)
// walks every arena and madvises each free page away (a few milliseconds for
// tens of MiB). A no-op off glibc.
//
// glibc also gives each thread that meets a locked arena an arena of its own,
// up to eight per core, and a freed block goes back to the arena it came
// from: a server's twenty threads then hold as many partly used heaps, and
// which thread allocated what (scheduling, not load) sets the RSS. A process
// that is not allocation-bound (the coordinator: the compute is the
// workers') caps them at start with LimitHeapArenas, before its threads.
#ifndef CHUNKATTN_BASE_HEAP_H_
#define CHUNKATTN_BASE_HEAP_H_

#include <cstdlib>  // defines __GLIBC__ on glibc
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace chunkattn {

// Caps the malloc arenas at `arenas` unless the environment chose
// (MALLOC_ARENA_MAX, or GLIBC_TUNABLES naming glibc.malloc.arena_max).
inline void LimitHeapArenas(int arenas) {
#if defined(__GLIBC__)
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr ||
      (tunables != nullptr && std::strstr(tunables, "glibc.malloc.arena_max") != nullptr)) {
    return;
  }
  mallopt(M_ARENA_MAX, arenas);
#else
  (void)arenas;
#endif
}

inline void ReleaseFreeHeap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_HEAP_H_
