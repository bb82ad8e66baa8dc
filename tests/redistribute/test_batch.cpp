// Batched redistribution (redistribute_all): many tensors in one exchange, against the same
// tensors redistributed one by one and against the global arrays, on every mesh of the world.

#include <xshard/redistribute/batch.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "expect_error.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xrandom.hpp>

#include <array>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using xshard::dynamic_layout;
using xshard::layout;
using xshard::testing::for_each_world_mesh;
using xshard::testing::where;
using M = xshard::mesh<"dp", "mp">;
using D2 = xshard::dtensor<double, M, dynamic_layout(2)>;

xt::xtensor<double, 2> array2(std::array<std::size_t, 2> shape, unsigned seed) {
    std::mt19937 e(seed);
    return xt::random::rand<double>(shape, -1.0, 1.0, e);
}

TEST(redistribute_all, matches_one_by_one_for_every_transition) {
    // (from, to) pairs: slices, all-gathers, all-to-alls, uneven blocks, reduce-scatters and
    // all-reduces from partial sums.
    const std::vector<std::pair<layout, layout>> moves{
        {"[-, mp]", "[dp, mp]"},
        {"[dp, mp]", "[-, mp]"},
        {"[(mp, dp), -]", "[-, -]"},
        {"[dp, -]", "[-, (dp, mp)]"},
        {"[-, mp] partial(sum: dp)", "[dp, mp]"},
        {"[-, -] partial(sum: dp, mp)", "[(dp, mp), -]"},
        {"[mp, -] partial(sum: dp)", "[mp, -]"},
    };
    const std::vector<std::array<std::size_t, 2>> shapes{{7, 5}, {13, 3}, {4, 9}, {1, 6}};
    for_each_world_mesh([&](const M& m) {
        std::vector<D2> in;
        std::vector<layout> to;
        std::vector<xt::xtensor<double, 2>> expected;
        unsigned seed = 1;
        for (const auto& [from, dest] : moves)
            for (const auto& shape : shapes) {
                const auto g = array2(shape, seed++);
                in.push_back(xshard::distribute<dynamic_layout(2)>(m, g, from));
                to.push_back(dest);
                expected.push_back(
                    xshard::gather_all(xshard::redistribute<dynamic_layout(2)>(in.back(), dest)));
            }
        const auto out = xshard::redistribute_all(in, to);
        ASSERT_EQ(out.size(), in.size());
        for (std::size_t i = 0; i < out.size(); ++i) {
            EXPECT_EQ(out[i].layout(), to[i]) << where(m);
            EXPECT_TRUE(xt::allclose(xshard::gather_all(out[i]), expected[i], 1e-14, 1e-14))
                << where(m) << " tensor " << i << " " << in[i].layout().to_string() << " -> "
                << to[i].to_string();
        }
    });
}

TEST(redistribute_all, a_tuple_of_ranks_and_the_bytes_of_a_fused_all_gather) {
    for_each_world_mesh([&](const M& m) {
        const auto g2 = array2({9, 4}, 3);
        xt::xtensor<double, 1> g1 = xt::arange<double>(11.0);
        const auto a = xshard::distribute<dynamic_layout(2)>(m, g2, layout("[dp, mp]"));
        const auto b = xshard::distribute<dynamic_layout(1)>(m, g1, layout("[(dp, mp)]"));
        auto [x, y] =
            xshard::redistribute_all(std::tuple(a, b), {layout("[-, mp]"), layout("[-]")});
        EXPECT_EQ(xshard::gather_all(x), g2) << where(m);
        EXPECT_EQ(xshard::gather_all(y), g1) << where(m);
        // One all-gather over dp of [dp, mp] sends this rank's block to each other dp rank.
        xshard::batch_redistribution_plan<double> plan(m);
        plan.add(a.shape(), a.layout(), layout("[-, mp]"));
        const auto dp = std::size_t(m.shape().axis_size("dp"));
        EXPECT_EQ(plan.bytes_sent(), a.local().size() * sizeof(double) * (dp - 1)) << where(m);
    });
}

TEST(redistribute_all, misuse_raises) {
    const M m = xshard::testing::world_mesh_2d();
    const auto a = xshard::distribute<dynamic_layout(2)>(m, array2({3, 4}, 1), layout("[dp, -]"));
    using xshard::testing::expect_error;
    expect_error([&] { (void)xshard::redistribute_all(std::vector{a}, {}); }, "1 tensors but 0");
    expect_error(
        [&] {
            (void)xshard::redistribute_all(std::vector{a}, {layout("[-, -] partial(sum: dp)")});
        },
        "is partial");
    expect_error([&] { (void)xshard::redistribute_all(std::vector{a}, {layout("[zz, -]")}); },
                 "axis");
}

} // namespace
