#pragma once
/// \file
/// Learning-rate schedules: callables from a step's index (0 for the first step) to its
/// learning rate, for an optimizer's `step(model, lr)`:
///
///     const xshard::optim::warmup_cosine schedule{
///         .base_lr = 1e-3, .warmup_steps = 100, .total_steps = 10000};
///     opt.step(model, schedule(opt.steps()));
///
/// They are constexpr (a schedule's values can be checked at compile time) and hold no state,
/// so a run resumed from a checkpoint only needs the optimizer's step count.

#include <xshard/comm/error.hpp>

#include <concepts>
#include <cstdint>
#include <numbers>
#include <string>

namespace xshard {

namespace detail {

/// cos(x) for x in [0, π], within a few units in the last place, in constant expressions too
/// (std::cos is constexpr only from C++26): a Taylor series on [0, π/2], where 12 terms
/// reach double precision, and cos(x) = -cos(π - x) beyond.
constexpr double cos_0_pi(double x) {
    constexpr double pi = std::numbers::pi;
    if (x > pi / 2)
        return -cos_0_pi(pi - x);
    double term = 1, sum = 1;
    for (int k = 1; k <= 12; ++k) {
        term *= -x * x / double((2 * k - 1) * (2 * k));
        sum += term;
    }
    return sum;
}

} // namespace detail

namespace optim {

/// A learning-rate schedule: the rate of a step, from its index (0 for the first step).
template <class S>
concept lr_schedule = requires(const S& s, std::int64_t step) {
    { s(step) } -> std::convertible_to<double>;
};

/// The same rate at every step.
struct constant_lr {
    double lr = 0;

    constexpr double operator()(std::int64_t) const noexcept { return lr; }
};

/// Linear warm-up, then cosine decay: step s < warmup_steps has base_lr · (s + 1) /
/// warmup_steps (from base_lr / warmup_steps up to base_lr); from warmup_steps to
/// total_steps the rate falls from base_lr to min_lr along half a cosine; from total_steps
/// on it is min_lr.
struct warmup_cosine {
    double base_lr = 0;
    std::int64_t warmup_steps = 0;
    std::int64_t total_steps = 0;
    double min_lr = 0;

    /// The rate of step `step`. Throws xshard::error (a compile error in a constant
    /// expression) for a negative step or rate, or total_steps < warmup_steps, or
    /// min_lr > base_lr.
    constexpr double operator()(std::int64_t step) const {
        check(step);
        if (step < warmup_steps)
            return base_lr * double(step + 1) / double(warmup_steps);
        if (step >= total_steps)
            return min_lr;
        const double progress = double(step - warmup_steps) / double(total_steps - warmup_steps);
        return min_lr +
               (base_lr - min_lr) * 0.5 * (1 + detail::cos_0_pi(std::numbers::pi * progress));
    }

private:
    constexpr void check(std::int64_t step) const {
        if (step < 0)
            throw error("xshard: warmup_cosine: the step must be >= 0, not " +
                        std::to_string(step));
        if (!(min_lr >= 0 && base_lr >= min_lr))
            throw error("xshard: warmup_cosine: the rates must satisfy 0 <= min_lr <= base_lr "
                        "(min_lr " +
                        std::to_string(min_lr) + ", base_lr " + std::to_string(base_lr) + ")");
        if (warmup_steps < 0 || total_steps < warmup_steps)
            throw error("xshard: warmup_cosine: the steps must satisfy 0 <= warmup_steps <= "
                        "total_steps (warmup_steps " +
                        std::to_string(warmup_steps) + ", total_steps " +
                        std::to_string(total_steps) + ")");
    }
};

} // namespace optim

} // namespace xshard
