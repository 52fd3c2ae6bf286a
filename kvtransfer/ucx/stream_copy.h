// stream_copy: a memcpy for destinations that another core reads next — a peer process's region
// mapped into this one (UcxTransport's direct copies). It writes with non-temporal stores, so
// the copy neither fetches the destination lines first (read-for-ownership: lines the reader's
// core holds from its last read must each be pulled over and invalidated, which made a 16-token
// request's 2 MiB copy 4-6x slower than the same memcpy between this thread's own buffers) nor
// evicts this core's working set for data it will not read again.
//
// Non-temporal stores are weakly ordered: after the last stream_copy, call stream_fence()
// before anything that tells the reader the bytes are there.
#pragma once

#include <cstddef>

namespace pdserve::kvtransfer {

// Copies `length` bytes from `src` to `dst` (non-overlapping), any sizes and alignments; short
// copies and CPUs without SSE2 use memcpy.
void stream_copy(void* dst, const void* src, size_t length);

// Orders every earlier stream_copy before this thread's later stores (sfence).
void stream_fence();

}  // namespace pdserve::kvtransfer
