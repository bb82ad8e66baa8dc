#pragma once
/// \file
/// All-reduce among the ranks of one node through a shared-memory window: every member
/// reads the others' summands in place, no message.

#include <xshard/comm/combine.hpp>
#include <xshard/comm/node_barrier.hpp>
#include <xshard/comm/reduction.hpp>
#include <xshard/comm/shared_window.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>

namespace xshard {

/// All-reduce of `n` elements from `in` into `out` (they may be the same buffer) over the
/// members of `window`, each of whose segments holds at least n elements of T. Member g owns
/// segment g (about n / p elements): every member first puts the segments others own into
/// its window (one copy of (p-1)/p n); after a node barrier g adds every member's term of its
/// segment, read in place (xsimd, cache-sized chunks), and publishes the result in its
/// window; after a second barrier every member copies the others' results. Each byte is read
/// once per stage; all members copy and add at the same time. A third barrier keeps a window
/// from being overwritten by the next call while a peer still reads it. Returns the bytes
/// peers read from this rank, counted as the pairwise algorithm counts its sends.
template <class T>
std::size_t node_all_reduce(const shared_window& window, node_barrier& barrier, const T* in, T* out,
                            std::size_t n, reduction op) {
    const auto p = std::size_t(window.size());
    const int me = window.rank();
    auto segment = [&](std::size_t g) {
        return std::pair{g * (n / p) + std::min(g, n % p), n / p + (g < n % p ? 1 : 0)};
    };
    auto staging = [&](int q) { return reinterpret_cast<T*>(window.segment(q)); };
    T* mine = staging(me);
    std::size_t sent = 0;
    for (std::size_t g = 0; g < p; ++g)
        if (int(g) != me) {
            const auto [lo, len] = segment(g);
            std::memcpy(mine + lo, in + lo, len * sizeof(T));
            sent += len * sizeof(T);
        }
    barrier.arrive_and_wait();
    const auto [lo, len] = segment(std::size_t(me));
    // Cache-sized chunks: the partial result stays in cache while each peer's term is added.
    constexpr std::size_t chunk = 4096;
    for (std::size_t c = lo; c < lo + len; c += chunk) {
        const std::size_t m = std::min(chunk, lo + len - c);
        bool first = true;
        for (int q = 0; q < int(p); ++q)
            if (q != me) {
                combine(out + c, first ? in + c : out + c, staging(q) + c, m, op);
                first = false;
            }
        if (first) // one member: nothing to add
            std::memmove(out + c, in + c, m * sizeof(T));
        std::memcpy(mine + c, out + c, m * sizeof(T));
    }
    sent += (p - 1) * len * sizeof(T);
    barrier.arrive_and_wait();
    for (std::size_t g = 0; g < p; ++g)
        if (int(g) != me) {
            const auto [glo, glen] = segment(g);
            std::memcpy(out + glo, staging(int(g)) + glo, glen * sizeof(T));
        }
    barrier.arrive_and_wait();
    return sent;
}

} // namespace xshard
