// Token sampling on the device, one block per row, picking what kernels/cpu/sampling.h's
// reference picks, so that only one int per row leaves the GPU instead of the row's logits.
//
// The reference sorts candidates; a block cannot sort a 128K vocabulary cheaply, so it works
// with cuts of the sorted order instead. Most likely first, lower index first among equals, the
// prefix ending at element (v, c) holds every probability above v and those equal to v with
// index <= c. "The shortest prefix whose count or mass reaches a target" — top_k, top_p and the
// draw alike — is then a binary search over v's bits (probabilities are non-negative floats,
// so their bits order as their values) followed by a walk, in index order, over the elements
// equal to v. Sums are in a fixed order (each thread's elements in turn, then a fixed tree), so
// a row samples the same token on every run; they can differ from the reference's sequential
// sums in the last bits of a double, which can move a token only for a draw within ~1e-16 of a
// boundary.
#include "kernels/gpu/kernel_util.h"
#include "kernels/gpu/sampling_kernel.h"

namespace pdserve::kernels::gpu {

void sample(int* tokens, const cpu::ShardedLogits& logits, const cpu::SampleRow* params, float* scratch,
            gpuStream_t stream) {
  if (logits.rows <= 0) return;
  sampling_detail::sample_kernel<<<logits.rows, sampling_detail::kSampleThreads, 0, stream>>>(tokens, logits, params,
                                                                                             scratch);
}

}  // namespace pdserve::kernels::gpu
