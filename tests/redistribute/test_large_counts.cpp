// Redistributions whose messages exceed MPI's int count: more than INT_MAX bytes in one
// message, against the values every rank computes itself. Label `large` (see
// tests/comm/test_large_counts.cpp).

#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/dtensor.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

// Named: the program's files compile as one unit (XSHARD_UNITY_TESTS), and share no names.
namespace redistribute_large_counts {

using xshard::testing::world;

constexpr std::size_t large = std::size_t(INT_MAX) + 13;

// Wraps modulo 256: cheap enough to recompute for every byte of a check.
std::uint8_t pattern(std::size_t i, int rank) {
    return std::uint8_t(i * 7 + std::size_t(rank) * 3);
}

/// Bytes the kernel can still hand out, from /proc/meminfo (0 when unknown).
std::size_t available_bytes() {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    std::size_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit)
        if (key == "MemAvailable:")
            return kib << 10;
    return 0;
}

// A pending sum of more than INT_MAX bytes resolved into a replicated tensor: the plan's
// all-reduce step over counts beyond int.
TEST(large_counts, redistribution_beyond_int) {
    const auto w = world();
    if (w.size() != 1)
        GTEST_SKIP() << "one rank: the all-reduce takes MPI's path with one message beyond int";
    using mesh_t = xshard::mesh<"x">;
    const mesh_t m(w, std::array{1});
    const std::array<std::size_t, 1> shape{large};
    auto local = xt::xtensor<std::uint8_t, 1>::from_shape(shape);
    for (std::size_t i = 0; i < large; ++i)
        local.data()[i] = pattern(i, 0);
    const auto src = xshard::from_local<"[-] partial(sum: x)">(m, shape, std::move(local));
    const xshard::reduce_tuning mpi_only{std::size_t(1) << 62, std::size_t(256) << 10};
    auto plan = xshard::make_redistribution<"[-]">(src, "[-]", {}, mpi_only);
    const auto out = plan(src);
    ASSERT_EQ(out.local().size(), large);
    std::size_t bad = large;
    const auto* got = out.local().data();
    for (std::size_t i = 0; i < large && bad == large; ++i)
        if (got[i] != pattern(i, 0))
            bad = i;
    EXPECT_EQ(bad, large);
}

// Every rank's block is more than INT_MAX bytes and travels to the other rank as one message.
TEST(large_counts, all_gather_of_blocks_beyond_int) {
    const auto w = world();
    if (w.size() != 2)
        GTEST_SKIP() << "two ranks";
    const std::size_t n = 2 * large;
    // Source and destination shards on both ranks, and headroom.
    if (available_bytes() < 2 * (large + n) + (std::size_t(2) << 30))
        GTEST_SKIP() << "needs " << (2 * (large + n)) / (1 << 20) << " MiB";
    using mesh_t = xshard::mesh<"x">;
    const mesh_t m(w, std::array{2});
    const std::array<std::size_t, 1> shape{n};
    auto local = xt::xtensor<std::uint8_t, 1>::from_shape({large});
    const std::size_t offset = std::size_t(w.rank()) * large;
    for (std::size_t i = 0; i < large; ++i)
        local.data()[i] = pattern(offset + i, 0);
    const auto src = xshard::from_local<"[x]">(m, shape, std::move(local));
    auto plan = xshard::make_redistribution<"[-]">(src);
    const auto out = plan(src);
    ASSERT_EQ(out.local().size(), n);
    std::size_t bad = n;
    const auto* got = out.local().data();
    for (std::size_t i = 0; i < n && bad == n; ++i)
        if (got[i] != pattern(i, 0))
            bad = i;
    EXPECT_EQ(bad, n) << "rank " << w.rank();
    EXPECT_EQ(plan.plan().bytes_sent(), large) << "rank " << w.rank();
}

} // namespace redistribute_large_counts
