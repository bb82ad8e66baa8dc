#pragma once
/// \file
/// Deferred, shard-local parameter initialisation (MindSpore's `no_init_parameters` and
/// `AutoParallel.no_init_parameters_in_compile`): each rank computes only the elements of its
/// own block of each weight, in place, and the values are those of initialising the whole
/// weight with the same seed, whatever the layout, mesh or world size.
///
/// What makes that possible is a *counter-based* generator: element i of the parameter named
/// `name` under seed s draws from bits(s, stream(name), i), a pure function (SplitMix64's
/// output function applied to a key and the counter i), so a block's values need neither the
/// elements before it nor any state. Initialising a block of n elements costs O(n) time and
/// no memory beyond the block itself (the tensor's shard, filled in place); sequential
/// engines (std::mt19937, what nn's layers draw from at construction) must instead step
/// through every element before the block.
///
/// The values are defined exactly (integer arithmetic, then one multiply-add per uniform;
/// Box-Muller for normals), so they are the same on every rank of a build.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numbers>
#include <span>
#include <string>
#include <string_view>

namespace xshard {

/// SplitMix64's output function: a bijective mix of 64 bits.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/// The random bits of element `index` of stream `stream` under `seed`: SplitMix64's
/// sequence for the key mix64(seed) ^ mix64(stream), read at position `index` (so each
/// element is computable on its own).
constexpr std::uint64_t counter_key(std::uint64_t seed, std::uint64_t stream) noexcept {
    return mix64(seed + 0x9e3779b97f4a7c15ULL) ^ mix64(~stream);
}
constexpr std::uint64_t keyed_bits(std::uint64_t key, std::uint64_t index) noexcept {
    return mix64(key + (index + 1) * 0x9e3779b97f4a7c15ULL);
}
constexpr std::uint64_t counter_bits(std::uint64_t seed, std::uint64_t stream,
                                     std::uint64_t index) noexcept {
    return keyed_bits(counter_key(seed, stream), index);
}

/// A uniform double in [0, 1) from 53 of `bits`.
constexpr double unit_of(std::uint64_t bits) noexcept {
    return double(bits >> 11) * 0x1.0p-53;
}

/// The stream of a parameter: FNV-1a of its dotted name (so values do not depend on the
/// order in which parameters are visited).
constexpr std::uint64_t parameter_stream(std::string_view name) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (const char c : name) {
        h ^= std::uint64_t(static_cast<unsigned char>(c));
        h *= 0x100000001b3ULL;
    }
    return h;
}

/// How a parameter's elements are drawn (MindSpore's initializers). `fan_in` of a shape is
/// the product of all its dimensions but the last (xshard's weights are [in, out]).
struct initializer {
    enum class kind { constant, uniform, normal, he_uniform };
    kind how = kind::constant;
    double a = 0; ///< constant: the value; uniform: lower; normal: mean; he_uniform: slope
    double b = 0; ///< uniform: upper; normal: standard deviation

    static constexpr initializer zeros() { return {kind::constant, 0, 0}; }
    static constexpr initializer constant(double v) { return {kind::constant, v, 0}; }
    static constexpr initializer uniform(double lower, double upper) {
        return {kind::uniform, lower, upper};
    }
    static constexpr initializer normal(double mean, double std_dev) {
        return {kind::normal, mean, std_dev};
    }
    /// MindSpore's HeUniform(negative_slope): uniform in +-sqrt(6 / ((1 + slope^2) fan_in)).
    /// The default slope sqrt(5) (MatMulCell's) gives +-1/sqrt(fan_in), nn's linear bounds.
    static initializer he_uniform(double negative_slope = std::sqrt(5.0)) {
        return {kind::he_uniform, negative_slope, 0};
    }

    /// The value of element `index` of a parameter of `shape` in `stream` under `seed`.
    double value(std::uint64_t seed, std::uint64_t stream, std::uint64_t index,
                 std::span<const std::size_t> shape) const {
        double v = 0;
        fill(&v, 1, seed, stream, index, shape);
        return v;
    }

    /// Elements `first` .. `first + n - 1` of a parameter of `shape` in `stream` under
    /// `seed`, into `out`: `value` of each, with what is the same for every element (the key,
    /// a uniform's bounds) worked out once.
    template <class T>
    void fill(T* out, std::size_t n, std::uint64_t seed, std::uint64_t stream, std::uint64_t first,
              std::span<const std::size_t> shape) const {
        const std::uint64_t key = counter_key(seed, stream);
        const auto uniform = [&](double lower, double width) {
            for (std::size_t i = 0; i < n; ++i)
                out[i] = T(lower + width * unit_of(keyed_bits(key, first + i)));
        };
        switch (how) {
        case kind::constant:
            std::fill(out, out + n, T(a));
            return;
        case kind::uniform:
            uniform(a, b - a);
            return;
        case kind::normal:
            // Box-Muller from each element's two counters 2i and 2i + 1.
            for (std::size_t i = 0; i < n; ++i) {
                const double u1 = 1.0 - unit_of(keyed_bits(key, 2 * (first + i)));
                const double u2 = unit_of(keyed_bits(key, 2 * (first + i) + 1));
                out[i] =
                    T(a + b * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2));
            }
            return;
        case kind::he_uniform: {
            std::size_t fan_in = 1;
            for (std::size_t d = 0; d + 1 < shape.size(); ++d)
                fan_in *= shape[d];
            const double bound = std::sqrt(6.0 / ((1.0 + a * a) * double(fan_in ? fan_in : 1)));
            uniform(-bound, 2 * bound);
            return;
        }
        }
    }
};

/// Which initializer a parameter takes, from its name and global shape.
using initializer_rule =
    std::function<initializer(const std::string& name, std::span<const std::size_t> shape)>;

/// The default rule, MindSpore's defaults: HeUniform(sqrt(5)) for weights of two or more
/// dimensions (MatMulCell's and Dense's), ones for a normalisation's scale (a weight named
/// "gamma" or ending in ".gamma": BatchNorm's and LayerNorm's gamma_init), zeros for the
/// others (biases, a normalisation's "beta").
XSHARD_DECL initializer default_initializer(const std::string& name,
                                            std::span<const std::size_t> shape);

/// Fills this rank's block of `t` (in place: no allocation) with the values element by
/// element of the whole tensor initialised by `init` in `stream` under `seed`: O(block) time,
/// no communication. Throws xshard::error (every rank alike) for a tensor with a pending sum.
template <distributed_tensor D>
void initialize(D& t, const initializer& init, std::uint64_t seed, std::uint64_t stream) {
    if (t.layout().is_partial())
        throw error("xshard: initialize: a tensor with a pending sum (" + t.layout().to_string() +
                    ") cannot be initialised");
    constexpr std::size_t N = D::rank;
    const auto shape = t.shape();
    const std::span<const std::size_t> dims(shape.data(), N);
    auto& local = t.local();
    using T = typename D::value_type;
    if constexpr (N == 0) {
        local() = T(init.value(seed, stream, 0, dims));
    } else {
        const auto b = t.block();
        if (local.size() == 0)
            return;
        // A run: the block's elements contiguous in the whole tensor, over dimensions
        // `inner` .. N - 1 (those after `inner` whole): one run for a replicated weight.
        std::size_t inner = N, run = 1;
        do {
            --inner;
            run *= b.extent[inner];
        } while (inner > 0 && b.extent[inner] == shape[inner]);
        std::array<std::size_t, N> idx{}; // local index of the current run (0 from `inner`)
        T* out = local.data();
        for (std::size_t k = 0; k < local.size(); k += run) {
            std::uint64_t start = 0; // global row-major index of the run's first element
            for (std::size_t d = 0; d < N; ++d)
                start = start * shape[d] + b.offset[d] + idx[d];
            init.fill(out, run, seed, stream, start, dims);
            out += run;
            for (std::size_t d = inner; d-- > 0;) { // advance to the next run
                if (++idx[d] < b.extent[d])
                    break;
                idx[d] = 0;
            }
        }
    }
}

/// Initialises every weight of `params` in place (see `initialize`): the weight named n takes
/// `rule(n, shape)` in stream parameter_stream(n) under `seed`. Each rank computes its own
/// blocks only; the gathered weights equal a whole initialisation on one rank with the same
/// seed. No communication; throws as `initialize` does (and what `rule` throws).
template <parameter_container C>
void initialize_parameters(C& params, std::uint64_t seed,
                           const initializer_rule& rule = default_initializer) {
    for_each_weight(params, [&](const std::string& name, auto& w) {
        const auto shape = w.value.shape();
        const auto init = rule(name, std::span<const std::size_t>(shape.data(), std::size(shape)));
        initialize(w.value, init, seed, parameter_stream(name));
    });
}

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/param/initializer.ipp>
#endif
