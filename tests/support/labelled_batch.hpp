#pragma once
// A random classification batch for the tests: rows of features in [-1, 1) and their labels.

#include <xtensor/xrandom.hpp>
#include <xtensor/xtensor.hpp>

#include <cstddef>
#include <cstdint>
#include <random>

namespace xshard::testing {

/// `rows` rows of `features` values in [-1, 1) and a label in [0, classes) for each.
struct labelled_batch {
    xt::xtensor<double, 2> x;
    xt::xtensor<std::int64_t, 1> y;
};

/// The batch of `rows` rows drawn from `seed` (the same on every rank).
inline labelled_batch random_labelled_batch(std::size_t rows, std::size_t features,
                                            std::size_t classes, unsigned seed) {
    std::mt19937 e(seed);
    labelled_batch b{xt::random::rand<double>({rows, features}, -1.0, 1.0, e), {}};
    b.y = xt::xtensor<std::int64_t, 1>::from_shape({rows});
    for (auto& v : b.y)
        v = std::int64_t(e() % classes);
    return b;
}

} // namespace xshard::testing
