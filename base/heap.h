// Gives the allocator's free pages back to the kernel. glibc keeps the pages
// of freed blocks inside its heaps (only the top of each heap is trimmed on
// free), so after a burst (a queue of long prompts, a worker's restart) a
// server's RSS stays at its peak long after the memory is free: operators
// read that as a leak, and a container limit counts it. A server calls this
// when it goes idle after work, at most every few seconds: malloc_trim(0)
// walks every arena and madvises each free page away (a few milliseconds for
// tens of MiB). A no-op off glibc.
#ifndef CHUNKATTN_BASE_HEAP_H_
#define CHUNKATTN_BASE_HEAP_H_

#include <cstdlib>  // defines __GLIBC__ on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace chunkattn {

inline void ReleaseFreeHeap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace chunkattn

#endif  // CHUNKATTN_BASE_HEAP_H_
