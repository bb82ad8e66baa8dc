#pragma once
/// \file
/// The definitions of what data/random.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/data/random.hpp>

namespace xshard::data {

XSHARD_DECL std::mt19937_64 seeded_engine(std::uint64_t seed, std::uint64_t stream) {
    std::seed_seq seq{std::uint32_t(seed), std::uint32_t(seed >> 32), std::uint32_t(stream),
                      std::uint32_t(stream >> 32)};
    return std::mt19937_64(seq);
}

XSHARD_DECL std::uint64_t uniform_below(std::mt19937_64& engine, std::uint64_t bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        const std::uint64_t x = engine();
        if (x >= threshold)
            return x % bound;
    }
}

XSHARD_DECL double standard_normal(std::mt19937_64& engine) {
    const double u1 = 1.0 - uniform_unit(engine); // (0, 1]: the logarithm stays finite
    const double u2 = uniform_unit(engine);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

} // namespace xshard::data

