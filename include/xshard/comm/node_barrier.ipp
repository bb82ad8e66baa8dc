#pragma once
/// \file
/// The definitions of what comm/node_barrier.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/node_barrier.hpp>

namespace xshard {

XSHARD_DECL node_barrier::node_barrier(const communicator& c)
    : window_(c, c.rank() == 0 ? 2 * line : 0)
    , comm_(c)
    , members_(std::uint64_t(c.size())) {
    // A new window's memory is not zeroed: the first member clears the counters before
    // anyone arrives.
    if (c.rank() == 0)
        std::memset(window_.segment(0), 0, 2 * line);
    window_.sync();
    barrier(c);
    window_.sync();
}

XSHARD_DECL void node_barrier::arrive_and_wait() {
    window_.sync();
    std::atomic_ref<std::uint64_t> count(*counter(0)), generation(*counter(1));
    const std::uint64_t g = generation.load(std::memory_order_acquire);
    if (count.fetch_add(1, std::memory_order_acq_rel) + 1 == members_) {
        count.store(0, std::memory_order_relaxed);
        generation.store(g + 1, std::memory_order_release);
    } else {
        // Watched (comm/watch.hpp) once the wait is no longer short.
        std::optional<detail::wait_watch> watch;
        for (unsigned spin = 0; generation.load(std::memory_order_acquire) == g; ++spin) {
            back_off(spin);
            if (spin == 64)
                watch.emplace("node barrier", comm_.native(), int(members_), 0);
            if (watch)
                watch->check({}, spin);
        }
        if (watch)
            watch->done();
    }
    window_.sync();
}

} // namespace xshard
