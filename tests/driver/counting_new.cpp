// This program's operator new, counting the bytes allocated while `counting` is set (the
// deferred_init tests check that initialising the shards allocates nothing). In a translation
// unit of its own so that no caller sees the malloc/free pair inlined.

#include <cstddef>
#include <cstdlib>
#include <new>

namespace xshard::testing {
std::size_t counted_bytes = 0;
bool counting = false;
} // namespace xshard::testing

void* operator new(std::size_t n) {
    if (xshard::testing::counting)
        xshard::testing::counted_bytes += n;
    if (void* p = std::malloc(n ? n : 1))
        return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
