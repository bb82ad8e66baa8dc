#pragma once
/// \file
/// The random numbers of the data pipeline, defined bit for bit: a std::mt19937_64 seeded
/// through std::seed_seq (both specified exactly by the standard) and xshard's own uniform
/// and normal draws on top of it. The standard distributions (std::shuffle,
/// std::uniform_int_distribution, std::normal_distribution) are left out on purpose: their
/// algorithms are implementation-defined, and every rank must draw the same numbers.

#include <xshard/compiled.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

namespace xshard::data {

/// A std::mt19937_64 seeded from `seed` and `stream` (e.g. the epoch) through std::seed_seq.
/// The same two numbers give the same engine on every rank and every platform.
XSHARD_DECL std::mt19937_64 seeded_engine(std::uint64_t seed, std::uint64_t stream);

/// A uniform integer in [0, bound), without modulo bias (draws below 2^64 mod bound are
/// rejected). Precondition: bound > 0.
XSHARD_DECL std::uint64_t uniform_below(std::mt19937_64& engine, std::uint64_t bound);

/// A uniform double in [0, 1) with 53 random bits.
inline double uniform_unit(std::mt19937_64& engine) {
    return double(engine() >> 11) * 0x1.0p-53;
}

/// A standard normal number (Box-Muller, one value per pair of uniforms). Bit-identical
/// wherever std::log, std::sqrt and std::cos are (always across the ranks of one build).
XSHARD_DECL double standard_normal(std::mt19937_64& engine);

} // namespace xshard::data

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/data/random.ipp>
#endif
