// Plans used directly (redistribute/plan.hpp): built once from layouts, run on raw local
// buffers many times; every rank's destination block holds the global elements the
// partition rule (written out element by element in support/layouts.hpp) assigns it.

#include <xshard/redistribute/plan.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <random>
#include <vector>

namespace {

using xshard::layout;
using xshard::testing::for_each_mesh;
using xshard::testing::where;

/// The global value at `index` of a tensor of `shape`, in round `round`.
long long value(const std::array<std::size_t, 2>& shape, const std::array<std::size_t, 2>& index,
                int round) {
    return (long long)(index[0] * shape[1] + index[1]) * 10 + round;
}

/// This rank's block of layout `l`: the elements it holds, in row-major order.
template <class Mesh>
std::vector<long long> block(const Mesh& m, const std::array<std::size_t, 2>& shape,
                             const layout& l, int round) {
    const auto coords = xshard::testing::coords_of(m.shape(), m.rank());
    std::vector<long long> out;
    for (std::size_t i = 0; i < shape[0]; ++i)
        for (std::size_t j = 0; j < shape[1]; ++j)
            if (xshard::testing::holds(l, m.shape(), shape, coords, {i, j}))
                out.push_back(value(shape, {i, j}, round));
    return out;
}

TEST(plan, built_once_run_many_times_on_raw_buffers) {
    for_each_mesh([](const auto& m) {
        const auto layouts = xshard::testing::all_layouts(m.shape(), 2, false);
        std::mt19937 rng(21);
        std::uniform_int_distribution<std::size_t> pick(0, layouts.size() - 1), extent(1, 9);
        for (int k = 0; k < 40; ++k) {
            const layout& from = layouts[pick(rng)];
            const layout& to = layouts[pick(rng)];
            const std::array<std::size_t, 2> shape{extent(rng), extent(rng)};
            if (from.is_partial() || to.is_partial())
                continue;
            xshard::redistribution_plan<long long, 2> plan(m, shape, from, to);
            EXPECT_EQ(plan.shape(), shape);
            EXPECT_EQ(plan.source_block().size(), block(m, shape, from, 0).size());
            EXPECT_EQ(plan.destination_block().size(), block(m, shape, to, 0).size());
            for (int round = 0; round < 3; ++round) {
                const auto in = block(m, shape, from, round);
                std::vector<long long> out(plan.destination_block().size(), -1);
                plan.execute(in.data(), out.data());
                ASSERT_EQ(out, block(m, shape, to, round))
                    << from << " -> " << to << " round " << round << " " << where(m) << "\n"
                    << plan.describe();
            }
        }
    });
}

} // namespace
