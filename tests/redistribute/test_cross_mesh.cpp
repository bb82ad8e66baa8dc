// Cross-mesh redistribution (redistribute/cross_mesh.hpp): random layout pairs between two
// meshes placed on disjoint, overlapping or equal sets of the world's ranks, with uneven
// extents and pending sums on either side. Every destination rank's block holds the global
// elements the partition rule (support/layouts.hpp, independent of core/partition.hpp)
// assigns it; pending terms are integers summing exactly; ranks in neither mesh take part in
// nothing.

#include <xshard/redistribute/cross_mesh.hpp>

#include "expect_error.hpp"
#include "layouts.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using xshard::layout;
using xshard::mesh_shape;
using xshard::placed_mesh;
using shape3 = std::array<std::size_t, 3>;

long long value(const shape3& s, const shape3& i) {
    return (long long)((i[0] * s[1] + i[1]) * s[2] + i[2]) * 3 + 1;
}

/// The term of `i` that term `t` of `k` holds: the terms sum to value(i).
long long term(const shape3& s, const shape3& i, int t, int k) {
    const long long other = (long long)(i[0] + 2 * i[1] + 5 * i[2]) + 7;
    return t == 0 ? value(s, i) - (k - 1) * other : other;
}

/// The elements of layout `l` that mesh rank `r` of `m` holds, row-major, through `f(index)`.
template <class F>
std::vector<long long> held(const layout& l, const mesh_shape& m, const shape3& s, int r, F&& f) {
    const auto c = xshard::testing::coords_of(m, r);
    std::vector<long long> out;
    for (std::size_t a = 0; a < s[0]; ++a)
        for (std::size_t b = 0; b < s[1]; ++b)
            for (std::size_t d = 0; d < s[2]; ++d)
                if (xshard::testing::holds(l, m, s, c, {a, b, d}))
                    out.push_back(f(shape3{a, b, d}));
    return out;
}

/// A random two-axis shape ("x", "y") of `n` ranks.
mesh_shape random_shape(int n, std::mt19937& rng) {
    std::vector<int> divisors;
    for (int d = 1; d <= n; ++d)
        if (n % d == 0)
            divisors.push_back(d);
    const int x = divisors[rng() % divisors.size()];
    return mesh_shape::parse("x=" + std::to_string(x) + ",y=" + std::to_string(n / x));
}

void run_case(const xshard::communicator& world, const placed_mesh& src, const layout& from,
              const placed_mesh& dst, const layout& to, const shape3& s, const std::string& where) {
    xshard::cross_mesh_plan<long long, 3> plan(world, s, src, from, dst, to, 5);
    const int me = world.rank();
    const int i = src.mesh_rank_of(me), j = dst.mesh_rank_of(me);
    EXPECT_EQ(plan.in_source(), i >= 0) << where;
    EXPECT_EQ(plan.in_destination(), j >= 0) << where;
    std::vector<long long> in, out;
    if (i >= 0) {
        const int k = src.shape.group_size(from.partial_axes(src.shape));
        const int t = src.shape.group_rank(i, from.partial_axes(src.shape));
        in = held(from, src.shape, s, i, [&](const shape3& x) { return term(s, x, t, k); });
        EXPECT_EQ(in.size(), plan.source_block().size()) << where;
    }
    std::vector<long long> expected;
    if (j >= 0) {
        bool keeps = true; // a pending sum keeps the values at coordinate 0 of its axes
        const auto c = xshard::testing::coords_of(dst.shape, j);
        for (const auto& a : to.partial)
            keeps = keeps && c[dst.shape.index(a.view())] == 0;
        expected =
            held(to, dst.shape, s, j, [&](const shape3& x) { return keeps ? value(s, x) : 0; });
        out.assign(plan.destination_block().size(), -99);
        EXPECT_EQ(out.size(), expected.size()) << where;
    }
    for (int round = 0; round < 2; ++round) { // built once, run twice
        plan.execute(in.empty() ? nullptr : in.data(), out.empty() ? nullptr : out.data());
        EXPECT_EQ(out, expected) << where << ", round " << round;
    }
    if (i < 0 && j < 0) {
        EXPECT_EQ(plan.summary().bytes_sent + plan.summary().bytes_received, 0u) << where;
    }
}

TEST(cross_mesh, random_layouts_between_disjoint_overlapping_and_equal_meshes) {
    const auto world = xshard::testing::world();
    const int p = world.size();
    std::mt19937 rng(1234); // the same draws on every rank
    const std::vector<shape3> shapes{{5, 7, 3}, {8, 4, 2}, {1, 9, 6}, {3, 2, 11}};
    for (int c = 0; c < 60; ++c) {
        std::vector<int> ranks(static_cast<std::size_t>(p));
        std::iota(ranks.begin(), ranks.end(), 0);
        std::shuffle(ranks.begin(), ranks.end(), rng);
        const int kind = c % 3; // 0 disjoint, 1 overlapping, 2 equal
        int a = 1 + int(rng() % std::size_t(p)), b = 1 + int(rng() % std::size_t(p));
        std::vector<int> src_ranks, dst_ranks;
        if (kind == 0 && p >= 2) {
            a = 1 + int(rng() % std::size_t(p - 1));
            b = 1 + int(rng() % std::size_t(p - a));
            src_ranks.assign(ranks.begin(), ranks.begin() + a);
            dst_ranks.assign(ranks.begin() + a, ranks.begin() + a + b);
        } else if (kind == 2) {
            src_ranks.assign(ranks.begin(), ranks.begin() + a);
            dst_ranks = src_ranks;
            if (rng() % 2)
                std::shuffle(dst_ranks.begin(), dst_ranks.end(), rng);
        } else {
            src_ranks.assign(ranks.begin(), ranks.begin() + a);
            std::shuffle(ranks.begin(), ranks.end(), rng);
            dst_ranks.assign(ranks.begin(), ranks.begin() + b);
        }
        const placed_mesh src{random_shape(int(src_ranks.size()), rng), src_ranks};
        const placed_mesh dst{random_shape(int(dst_ranks.size()), rng), dst_ranks};
        const auto from_all = xshard::testing::all_layouts(src.shape, 3, false);
        const auto to_all = xshard::testing::all_layouts(dst.shape, 3, false);
        const layout from = from_all[rng() % from_all.size()];
        const layout to = to_all[rng() % to_all.size()];
        const shape3 s = shapes[std::size_t(c) % shapes.size()];
        run_case(world, src, from, dst, to, s,
                 "case " + std::to_string(c) + ": " + from.to_string() + " on " + src.to_string() +
                     " -> " + to.to_string() + " on " + dst.to_string() + ", rank " +
                     std::to_string(world.rank()));
    }
}

TEST(cross_mesh, stage_slices_and_misuse) {
    const auto world = xshard::testing::world();
    const int p = world.size();
    if (p % 2 == 0) {
        // Two pipeline stages of p/2 ranks each, factored differently.
        const auto full = mesh_shape::parse("pp=2,r=" + std::to_string(p / 2));
        const auto a =
            placed_mesh::slice_of(full, 0, 0, mesh_shape::parse("x=1,y=" + std::to_string(p / 2)));
        const auto b = placed_mesh::slice_of(
            full, 0, 1, mesh_shape::parse("x=" + std::to_string(p / 2) + ",y=1"));
        EXPECT_EQ(a.ranks.front(), 0);
        EXPECT_EQ(b.ranks.front(), p / 2);
        run_case(world, a, layout("[y, -, -]"), b, layout("[-, x, -]"), {6, 5, 2},
                 "stages, rank " + std::to_string(world.rank()));
        run_case(world, a, layout("[-, -, -] partial(sum: y)"), b, layout("[x, -, -]"), {7, 3, 2},
                 "partial stage, rank " + std::to_string(world.rank()));
    }
    if (p == 8) {
        const placed_mesh a{mesh_shape::parse("dp=2,tp=1"), {4, 5}};
        const placed_mesh b{mesh_shape::parse("dp=1,tp=2"), {2, 3}};
        run_case(world, a, layout("[dp, -, -] partial(sum: tp)"), b,
                 layout("[dp, -, -] partial(sum: tp)"), {4, 12, 1},
                 "pipeline case, rank " + std::to_string(world.rank()));
    }
    using xshard::testing::expect_error;
    const placed_mesh one{mesh_shape::parse("x=1,y=1"), {0}};
    expect_error(
        [&] {
            xshard::cross_mesh_plan<double, 2>(world, {2, 2}, one, layout("[z, -]"), one,
                                               layout("[-, -]"));
        },
        "names an axis the mesh(x=1, y=1) does not have");
    expect_error(
        [&] {
            xshard::cross_mesh_plan<double, 2>(world, {2, 2},
                                               {mesh_shape::parse("x=1,y=1"), {0, 0}},
                                               layout("[-, -]"), one, layout("[-, -]"));
        },
        "has 1 ranks but is placed on 2");
    expect_error(
        [&] {
            xshard::cross_mesh_plan<double, 2>(world, {2, 2}, one, layout("[-, -, -]"), one,
                                               layout("[-, -]"));
        },
        "is for rank 3, the tensor has rank 2");
}

} // namespace
