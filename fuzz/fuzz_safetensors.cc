// The safetensors reader on arbitrary files: the 8-byte header length, the JSON header and every
// tensor's dtype, shape and offsets are checked against the file, so any bytes give a table or
// an error, never a crash or a read past the mapping.
#include <cstddef>
#include <cstdint>

#include "engine/model/safetensors.h"
#include "fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pdserve::fuzz::MemFile file(data, size);
  pdserve::engine::TensorTable table;
  (void)pdserve::engine::add_safetensors_file(file.path(), table);
  return 0;
}
