// The llama2.c checkpoint reader on arbitrary files: a header of seven int32 then the weights;
// nonsense header values or a size that does not match give an error, never a crash.
#include <cstddef>
#include <cstdint>

#include "engine/model/llama2c_checkpoint.h"
#include "fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pdserve::fuzz::MemFile file(data, size);
  (void)pdserve::engine::read_llama2c_checkpoint(file.path());
  return 0;
}
