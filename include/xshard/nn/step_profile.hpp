#pragma once
/// \file
/// Where a training step of the convolutional layers spends its time: wall-clock seconds per
/// part (the local convolution and pooling kernels forward and backward, batch norm's local
/// work, the collectives inside batch norm and global pooling, the halo exchanges and their
/// adjoints), accumulated per process while `step_profile::enabled` is on (off by default:
/// then a scope costs one load and a branch). For benchmarks (bench_convnet's phase lines);
/// not thread-safe (one thread per rank, as the layers run).
///
///     nn::step_profile::reset();
///     nn::step_profile::enabled = true;
///     net.forward(x); ...
///     nn::step_profile::enabled = false;
///     double s = nn::step_profile::seconds(nn::step_part::halo);
///
/// A halo's time includes waiting for the neighbouring band (the ranks' imbalance shows
/// there), a collective's its wait for the slowest member.

#include <array>
#include <chrono>
#include <cstddef>

namespace xshard::nn {

/// The parts of a step that `step_profile` times.
enum class step_part : unsigned char {
    conv_forward,     ///< the local convolution kernel, forward
    conv_backward,    ///< the local convolution kernels, backward to the input and weights
    pool,             ///< the local pooling kernels (max, average, global), both directions
    batch_norm,       ///< batch norm forward and backward, its all-reduces included
    collectives,      ///< the all-reduces inside batch norm and global pooling
    halo,             ///< halo exchanges (forward) and their adjoints (backward)
    count_
};

inline constexpr std::array<const char*, std::size_t(step_part::count_)> step_part_names{
    "conv_forward", "conv_backward", "pool", "batch_norm", "collectives", "halo"};

/// The per-process accumulators: see the file comment.
struct step_profile {
    static inline bool enabled = false;
    static inline std::array<double, std::size_t(step_part::count_)> totals{};

    static void reset() noexcept { totals.fill(0.0); }
    static double seconds(step_part p) noexcept { return totals[std::size_t(p)]; }
};

/// Adds the time from construction to destruction to `part` when profiling is on.
class profile_scope {
public:
    explicit profile_scope(step_part part) noexcept
        : part_(part)
        , on_(step_profile::enabled) {
        if (on_)
            start_ = std::chrono::steady_clock::now();
    }
    profile_scope(const profile_scope&) = delete;
    profile_scope& operator=(const profile_scope&) = delete;
    ~profile_scope() {
        if (on_)
            step_profile::totals[std::size_t(part_)] +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }

private:
    step_part part_;
    bool on_;
    std::chrono::steady_clock::time_point start_{};
};

} // namespace xshard::nn
