#pragma once
/// \file
/// An allocator that counts: how plans and reducers account for their scratch buffers (the
/// peak extra memory a plan predicts is checked against what it allocated).

#include <algorithm>
#include <cstddef>
#include <memory>

namespace xshard {

/// Counts the bytes allocated through a `counting_allocator`.
struct allocation_stats {
    std::size_t live = 0;
    std::size_t peak = 0;
    std::size_t allocations = 0;
};

/// std::allocator that records into an allocation_stats (when given one): how plans and
/// reducers account for their scratch buffers.
template <class T>
struct counting_allocator {
    using value_type = T;
    allocation_stats* stats = nullptr;

    counting_allocator() = default;
    explicit counting_allocator(allocation_stats* s)
        : stats(s) {}
    template <class U>
    counting_allocator(const counting_allocator<U>& o)
        : stats(o.stats) {}

    T* allocate(std::size_t n) {
        if (stats) {
            stats->live += n * sizeof(T);
            stats->peak = std::max(stats->peak, stats->live);
            ++stats->allocations;
        }
        return std::allocator<T>().allocate(n);
    }
    void deallocate(T* p, std::size_t n) {
        if (stats)
            stats->live -= n * sizeof(T);
        std::allocator<T>().deallocate(p, n);
    }
    template <class U>
    friend bool operator==(const counting_allocator& a, const counting_allocator<U>& b) {
        return a.stats == b.stats;
    }
};

} // namespace xshard
