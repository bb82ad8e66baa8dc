#pragma once
/// \file
/// Checked size arithmetic: products and sums of extents that raise instead of wrapping
/// around. Sizes computed from input (a file, a command line, a strategy) go through these.

#include <xshard/comm/error.hpp>

#include <cstddef>
#include <initializer_list>
#include <ranges>
#include <string>

namespace xshard {

/// `a * b`, or throws `xshard::error` (naming `what`) when it does not fit a std::size_t.
constexpr std::size_t checked_mul(std::size_t a, std::size_t b, const char* what = "a size") {
    std::size_t r = 0;
    if (__builtin_mul_overflow(a, b, &r))
        throw error(std::string("xshard: ") + what + " overflows: " + std::to_string(a) + " x " +
                    std::to_string(b));
    return r;
}

/// `a + b`, or throws `xshard::error` (naming `what`) when it does not fit a std::size_t.
constexpr std::size_t checked_add(std::size_t a, std::size_t b, const char* what = "a size") {
    std::size_t r = 0;
    if (__builtin_add_overflow(a, b, &r))
        throw error(std::string("xshard: ") + what + " overflows: " + std::to_string(a) + " + " +
                    std::to_string(b));
    return r;
}

/// The number of elements of a box of `extents` (1 for none), or throws `xshard::error`
/// when the product does not fit a std::size_t. A zero extent makes the volume 0 whatever
/// the others are (no overflow is reported past it).
template <std::ranges::input_range R>
constexpr std::size_t volume(const R& extents) {
    std::size_t n = 1;
    for (auto e : extents) {
        if (static_cast<std::size_t>(e) == 0)
            return 0;
    }
    for (auto e : extents)
        n = checked_mul(n, static_cast<std::size_t>(e), "the number of elements");
    return n;
}

/// `volume` of an initializer list: `volume({rows, cols})`.
constexpr std::size_t volume(std::initializer_list<std::size_t> extents) {
    std::size_t n = 1;
    for (auto e : extents)
        if (e == 0)
            return 0;
    for (auto e : extents)
        n = checked_mul(n, e, "the number of elements");
    return n;
}

} // namespace xshard
