#include "core/storage.h"

namespace cf {

Storage::Storage(size_t n, Device d) : nbytes(n), device(d) {
  data = allocator_for(d).allocate(n);
}

Storage::~Storage() { allocator_for(device).deallocate(data, nbytes); }

}  // namespace cf
