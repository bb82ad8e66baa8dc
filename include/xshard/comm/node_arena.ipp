#pragma once
/// \file
/// The definitions of what comm/node_arena.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/node_arena.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL void* node_arena_state::allocate(std::size_t bytes) {
    const std::size_t n = round_up(bytes == 0 ? 1 : bytes);
    const std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second < n)
            continue;
        const auto [at, size] = *it;
        free_.erase(it);
        if (size > n)
            free_.emplace(at + n, size - n);
        used_.emplace(at, n);
        return window_.local() + at;
    }
    return nullptr;
}

XSHARD_DECL void node_arena_state::deallocate(void* p) {
    const std::lock_guard lock(mutex_);
    const auto at = std::size_t(static_cast<std::byte*>(p) - window_.local());
    const auto u = used_.find(at);
    if (u == used_.end())
        return;
    std::size_t lo = at, size = u->second;
    used_.erase(u);
    auto next = free_.lower_bound(lo);
    if (next != free_.end() && next->first == lo + size) {
        size += next->second;
        next = free_.erase(next);
    }
    if (next != free_.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == lo) {
            lo = prev->first;
            size += prev->second;
            free_.erase(prev);
        }
    }
    free_.emplace(lo, size);
}

} // namespace detail
} // namespace xshard
