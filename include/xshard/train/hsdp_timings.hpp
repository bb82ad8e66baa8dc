#pragma once
/// \file
/// Where the time of optimizer sharding's steps goes (train/hsdp.hpp): its phases, summed.

#include <chrono>

namespace xshard {

/// Seconds a sharding spent in each phase of its steps, summed since construction or
/// `reset_timings()`: what bounds a step (bench_training prints them).
struct hsdp_timings {
    double compute = 0;      ///< the layers' forward and backward run by hsdp::forward/backward
    double gather_wait = 0;  ///< all-gathers: packing, starting and waiting for them (exposed)
    double reduce_wait = 0;  ///< gradient reductions: packing, starting, waiting (exposed)
    double local_copies = 0; ///< master blocks and gradients sliced into the shards (local)
    double update = 0;       ///< the optimizer's update of the shards
    int steps = 0;           ///< calls of `step`
};

namespace detail {

/// The clock the phases are measured with.
using hsdp_clock = std::chrono::steady_clock;

/// The seconds since `t`.
inline double seconds_since(hsdp_clock::time_point t) {
    return std::chrono::duration<double>(hsdp_clock::now() - t).count();
}

} // namespace detail

} // namespace xshard
