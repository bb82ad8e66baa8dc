#pragma once
// Parameters for the tests of param/ and train/: tensors whose every element is a value each
// rank can compute alone, so that expectations need no communication.

#include <xshard/core/layout.hpp>
#include <xshard/tensor/distribute.hpp>

#include <array>
#include <cstddef>

namespace xshard::testing {

/// A double tensor of rank 2 with a run-time layout on mesh `M`.
template <class M>
using dyn = dtensor<double, M, dynamic_layout(2)>;

/// A tensor of layout `l` whose every local element i is `value(rank, i)` on this rank.
template <class T, class M, class F>
auto filled(const M& m, std::array<std::size_t, 2> shape, const layout& l, F value) {
    auto t = zeros<T, dynamic_layout(2)>(m, shape, l);
    for (std::size_t i = 0; i < t.local().size(); ++i)
        t.local().data()[i] = T(value(m.rank(), i));
    return t;
}

/// The value rank r starts with at element i of a parameter: distinct for every rank.
inline double start(int rank, std::size_t i) {
    return 1000.0 * (rank + 1) + double(i);
}

} // namespace xshard::testing
