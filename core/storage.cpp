#include "core/storage.h"

namespace cf {

Storage::Storage(size_t n, Device d) : nbytes(n), device(d) {
  data = allocator_for(d).allocate(n);
}

Storage::Storage(void* p, size_t n, Device d, std::function<void()> r)
    : data(p), nbytes(n), device(d), release(std::move(r)) {}

Storage::~Storage() {
  if (release) {
    release();
    return;
  }
  allocator_for(device).deallocate(data, nbytes);
}

}  // namespace cf
