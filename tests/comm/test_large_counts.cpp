// Counts beyond MPI's int: collectives over more than INT_MAX elements (bytes) per rank,
// against values computed independently. Label `large`: each case moves more than 2 GiB per
// rank, so these run apart from the fast suite.

#include <xshard/comm/collectives.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

// Named: the program's files compile as one unit (XSHARD_UNITY_TESTS), and share no names.
namespace comm_large_counts {

using xshard::reduction;
using xshard::testing::world;

// Just past MPI's int: the derived-type path with a remainder after the 2^30-element chunks.
constexpr std::size_t large = std::size_t(INT_MAX) + 13;

// Wraps modulo 256: cheap enough to recompute for every byte of a check.
std::uint8_t pattern(std::size_t i, int rank) {
    return std::uint8_t(i * 7 + std::size_t(rank) * 3);
}

/// The first index where `v` differs from `expected(i)`, or v.size().
template <class F>
std::size_t first_mismatch(const std::vector<std::uint8_t>& v, F expected) {
    for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] != expected(i))
            return i;
    return v.size();
}

TEST(large_counts, bcast_beyond_int) {
    const auto w = world();
    const int root = w.size() - 1;
    std::vector<std::uint8_t> v(large);
    if (w.rank() == root)
        for (std::size_t i = 0; i < v.size(); ++i)
            v[i] = pattern(i, root);
    xshard::mpi::bcast(w, v, root);
    EXPECT_EQ(first_mismatch(v, [&](std::size_t i) { return pattern(i, root); }), v.size())
        << "rank " << w.rank();
}

TEST(large_counts, allreduce_beyond_int) {
    const auto w = world();
    std::vector<std::uint8_t> v(large);
    for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = pattern(i, w.rank());
    xshard::mpi::allreduce(w, v, reduction::sum); // in place
    EXPECT_EQ(first_mismatch(v,
                             [&, p = std::size_t(w.size())](std::size_t i) {
                                 // sum over q of 7 i + 3 q, modulo 256
                                 return std::uint8_t(p * 7 * i + 3 * p * (p - 1) / 2);
                             }),
              v.size())
        << "rank " << w.rank();
}

} // namespace comm_large_counts
