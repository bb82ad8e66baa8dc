#pragma once
/// \file
/// The objective of a strategy search by level (MindSpore's search objective): 0 the least
/// communication, 1 the least memory, 2 the fastest. A level orders candidates
/// lexicographically by a primary and a secondary figure: communication then time at 0,
/// memory then time at 1, time then memory at 2. The strategy search (search/) compares
/// predictions exactly, the primary figure rounded to 40 bits of mantissa; shard()'s derived
/// layouts (the option sharding_propagation, shard/derivation.hpp) compare measured times
/// within a tolerance.

#include <xshard/compiled.hpp>

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

namespace xshard {

/// What the levels mean, for messages.
inline constexpr std::string_view objective_levels =
    "0 (least communication), 1 (least memory) or 2 (fastest)";

/// Whether `level` is an objective level.
constexpr bool is_objective_level(int level) {
    return level >= 0 && level <= 2;
}

/// "`who`'s level is 0 (...), 1 (...) or 2 (...), not `level`": the message of a bad level.
XSHARD_DECL std::string bad_objective_level(std::string_view who, int level);

/// `x` rounded to 40 bits of mantissa (infinities and NaN as they are): sums of the same
/// terms added in another order, which differ in their last bits, round alike.
constexpr double rounded_to_40_bits(double x) {
    if (!(x - x == 0))
        return x;
    constexpr std::uint64_t dropped = (std::uint64_t(1) << 12) - 1; // 52 - 40 mantissa bits
    return std::bit_cast<double>((std::bit_cast<std::uint64_t>(x) + (dropped + 1) / 2) & ~dropped);
}

/// A candidate's place in an objective's order: (primary, secondary), compared
/// lexicographically, the primary figure to 40 bits of mantissa (`rounded_to_40_bits`): where
/// two candidates' primary figures are the same sum written in another order, the secondary
/// figure decides, whichever order the search added them in.
struct objective_key {
    double first = 0, second = 0;
    friend constexpr bool operator<(const objective_key& a, const objective_key& b) {
        const double x = rounded_to_40_bits(a.first), y = rounded_to_40_bits(b.first);
        return x < y || (x == y && a.second < b.second);
    }
    friend constexpr bool operator<=(const objective_key& a, const objective_key& b) {
        return !(b < a);
    }
};

/// The key of a candidate taking `seconds`, communicating `communication` (seconds or bytes)
/// and holding `memory` bytes, by objective `level`.
constexpr objective_key objective_of(int level, double seconds, double communication,
                                     double memory) {
    if (level == 1)
        return {memory, seconds};
    if (level == 0)
        return {communication, seconds};
    return {seconds, memory};
}

static_assert(objective_of(0, 1, 2, 3).first == 2 && objective_of(0, 1, 2, 3).second == 1);
static_assert(objective_of(1, 1, 2, 3).first == 3 && objective_of(2, 1, 2, 3).second == 3);
static_assert(objective_key{1, 5} < objective_key{2, 0} && objective_key{1, 0} < objective_key{1, 5});
static_assert(objective_key{0.1 + 0.2, 1} < objective_key{0.3, 2} &&
              objective_key{0.3, 1} < objective_key{0.1 + 0.2, 2} &&
              rounded_to_40_bits(1.0 + 0x1p-42) == 1.0 && rounded_to_40_bits(1.0 + 0x1p-40) > 1.0);

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/core/objective.ipp>
#endif
