// Distributed tensors: distribute -> gather round trips for every layout, shard shapes,
// random fills, wrapping local shards, elementwise arithmetic, drawings.

#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>
#include <xshard/tensor/expression.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/tensor/visualize.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xarray.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xtensor.hpp>

#include <complex>
#include <random>
#include <sstream>

namespace {

using xshard::dynamic_layout;
using xshard::layout;
using xshard::testing::all_layouts;
using xshard::testing::for_each_mesh;
using xshard::testing::test_shapes;
using xshard::testing::where;
using xshard::testing::world;

/// A global array whose elements are distinct (their linear index, plus one).
template <class T, std::size_t N>
xt::xtensor<T, N> iota(const std::array<std::size_t, N>& shape) {
    auto a = xt::xtensor<T, N>::from_shape(shape);
    for (std::size_t i = 0; i < a.size(); ++i)
        a.data()[i] = T(i + 1);
    return a;
}

template <std::size_t N, class Mesh>
void round_trip_every_layout(const Mesh& m) {
    using T = double;
    for (const auto& shape : test_shapes<N>()) {
        const auto global = iota<T, N>(shape);
        const auto empty = xt::xtensor<T, N>::from_shape(std::array<std::size_t, N>{});
        for (const auto& l : all_layouts(m.shape(), N, true)) {
            const int root = m.size() - 1;
            auto from_root = xshard::distribute_from<dynamic_layout(N)>(
                m, m.rank() == root ? global : empty, root, l);
            auto from_all = xshard::distribute<dynamic_layout(N)>(m, global, l);
            // Local shapes follow the partition arithmetic.
            const auto b = xshard::block_of(l, m.shape(), shape, m.rank());
            ASSERT_EQ(xshard::detail::to_array<N>(from_root.local().shape()), b.extent)
                << l << " " << where(m);
            ASSERT_EQ(from_root.local(), from_all.local()) << l << " " << where(m);
            const auto back = xshard::gather(from_root, 0);
            if (m.rank() == 0) {
                ASSERT_EQ(back, global)
                    << l << " shape " << xshard::detail::shape_string(shape) << " " << where(m);
            }
            ASSERT_EQ(xshard::gather_all(from_all), global) << l << " " << where(m);
        }
    }
}

TEST(dtensor, distribute_and_gather_round_trip_for_every_layout) {
    for_each_mesh([](const auto& m) {
        round_trip_every_layout<1>(m);
        round_trip_every_layout<2>(m);
        round_trip_every_layout<3>(m);
    });
}

TEST(dtensor, partial_terms_gather_to_their_reduction) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 2> shape{5, 3};
        for (const auto& l : all_layouts(m.shape(), 2, true)) {
            if (!l.is_partial())
                continue;
            // A rank's term depends on its position along the partial axes only (ranks that
            // differ along replicated axes are replicas and must agree).
            const auto partial = l.partial_axes(m.shape());
            const int terms = m.shape().group_size(partial);
            auto term = [](int p, std::size_t i, std::size_t j) {
                return double((p + 1) * 100 + int(i * 10 + j)) * (p % 2 ? -1.0 : 1.0);
            };
            const int p = m.shape().group_rank(m.rank(), partial);
            const auto b = xshard::block_of(l, m.shape(), shape, m.rank());
            auto local = xt::xtensor<double, 2>::from_shape(b.extent);
            for (std::size_t i = 0; i < b.extent[0]; ++i)
                for (std::size_t j = 0; j < b.extent[1]; ++j)
                    local(i, j) = term(p, b.offset[0] + i, b.offset[1] + j);
            const auto t = xshard::from_local(m, shape, local, l);

            auto expected = xt::xtensor<double, 2>::from_shape(shape);
            for (std::size_t i = 0; i < shape[0]; ++i) {
                for (std::size_t j = 0; j < shape[1]; ++j) {
                    double v = term(0, i, j);
                    for (int q = 1; q < terms; ++q)
                        v = l.op == xshard::reduction::sum ? v + term(q, i, j)
                                                           : std::max(v, term(q, i, j));
                    expected(i, j) = v;
                }
            }
            EXPECT_EQ(xshard::gather_all(t), expected) << l << " " << where(m);
        }
    });
}

TEST(dtensor, static_layouts_make_typed_tensors) {
    const auto w = world();
    if (w.size() % 2)
        GTEST_SKIP() << "needs an even number of ranks";
    const xshard::mesh<"dp", "mp"> m(w, {xshard::auto_size, 2});
    const std::array<std::size_t, 2> shape{7, 6};
    const auto global = iota<int, 2>(shape);

    auto a = xshard::distribute<"[dp, mp]">(m, global);
    static_assert(
        std::is_same_v<decltype(a), xshard::dtensor<int, xshard::mesh<"dp", "mp">, "[dp, mp]">>);
    static_assert(decltype(a)::static_layout == layout("[dp, mp]"));
    EXPECT_EQ(xshard::gather_all(a), global);

    auto b = xshard::distribute_from<"[(dp,mp), -]">(m, global, 0);
    EXPECT_EQ(b.local().shape()[0],
              xshard::block_extent(7, std::size_t(w.size()), std::size_t(w.rank())));
    EXPECT_EQ(xshard::gather_all(b), global);

    const auto z = xshard::zeros<double, "[-, mp] partial(sum: dp)">(m, shape);
    EXPECT_EQ(xshard::gather_all(z), (xt::zeros<double>(shape)));
    const auto o = xshard::ones<double, "[-, mp] partial(sum: dp)">(m, shape);
    EXPECT_EQ(xshard::gather_all(o), (xt::ones<double>(shape))); // one term holds the ones
    const auto f = xshard::full<std::complex<double>, "[dp, -]">(m, shape, {1.0, -2.0});
    EXPECT_EQ(xshard::gather_all(f)(6, 5), std::complex<double>(1.0, -2.0));

    std::ostringstream os;
    os << a;
    EXPECT_EQ(os.str(),
              "dtensor [dp, mp] (7, 6) on mesh(dp=" + std::to_string(w.size() / 2) + ", mp=2)");
}

TEST(dtensor, random_fills_do_not_depend_on_the_layout) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 3> shape{3, 5, 4};
        std::mt19937 e1(42), e2(42), e3(42);
        const xt::xtensor<double, 3> uniform = xt::random::rand<double>(shape, 0.0, 1.0, e1);
        const xt::xtensor<float, 3> normal = xt::random::randn<float>(shape, 0.0f, 1.0f, e2);
        const xt::xtensor<int, 3> integers = xt::random::randint<int>(shape, -5, 5, e3);
        for (const auto& l : all_layouts(m.shape(), 3)) {
            if (l.is_partial())
                continue;
            EXPECT_EQ(xshard::gather_all(
                          xshard::rand<double, dynamic_layout(3)>(m, shape, 42, 0.0, 1.0, l)),
                      uniform)
                << l << " " << where(m);
            EXPECT_EQ(xshard::gather_all(
                          xshard::randn<float, dynamic_layout(3)>(m, shape, 42, 0.0f, 1.0f, l)),
                      normal)
                << l << " " << where(m);
            EXPECT_EQ(
                xshard::gather_all(xshard::randint<int, dynamic_layout(3)>(m, shape, 42, -5, 5, l)),
                integers)
                << l << " " << where(m);
        }
    });
}

TEST(dtensor, a_wrong_local_shard_throws_on_every_rank) {
    const auto w = world();
    const xshard::mesh<"x"> m(w, {w.size()});
    const std::array<std::size_t, 2> shape{std::size_t(2 * w.size() + 1), 3};
    const auto b = xshard::block_of(layout("[x, -]"), m.shape(), shape, m.rank());
    // The last rank gets one row too many.
    auto local = xt::xtensor<double, 2>::from_shape(
        {b.extent[0] + (m.rank() == m.size() - 1 ? 1 : 0), b.extent[1]});
    try {
        (void)xshard::from_local<"[x, -]">(m, shape, local);
        ADD_FAILURE() << "no exception";
    } catch (const xshard::error& e) {
        const auto r = w.size() - 1;
        const auto expected = xshard::block_of(layout("[x, -]"), m.shape(), shape, r).extent;
        EXPECT_EQ(std::string(e.what()),
                  "xshard: from_local: the local shard of rank " + std::to_string(r) +
                      " has shape (" + std::to_string(expected[0] + 1) +
                      ", 3) but layout [x, -] "
                      "on mesh(x=" +
                      std::to_string(w.size()) + ") gives it (" + std::to_string(expected[0]) +
                      ", 3) of global shape " + xshard::detail::shape_string(shape));
    }
    // Ranks that disagree on the global shape.
    if (w.size() > 1) {
        const std::array<std::size_t, 1> mine{std::size_t(4 + m.rank())};
        auto l1 = xt::xtensor<double, 1>::from_shape(
            {xshard::block_extent(mine[0], std::size_t(w.size()), std::size_t(m.rank()))});
        EXPECT_THROW((void)xshard::from_local<"[x]">(m, mine, l1), xshard::error);
    }
    // A layout that does not fit the mesh, at run time.
    EXPECT_THROW((void)xshard::from_local(m, shape, local, layout("[y, -]")), xshard::error);
    EXPECT_THROW((void)xshard::from_local(m, shape, local, layout("[x]")), xshard::error);
}

TEST(dtensor, distributing_arrays_of_different_shapes_throws_on_every_rank) {
    const auto w = world();
    const xshard::mesh<"x"> m(w, {w.size()});
    const bool odd_one = m.rank() == m.size() - 1;
    // The last rank's array has one row more (at one rank: every rank's array agrees).
    const auto a = iota<double, 2>({std::size_t(5 + (odd_one && w.size() > 1 ? 1 : 0)), 3});
    if (w.size() > 1) {
        try {
            (void)xshard::distribute<"[x, -]">(m, a);
            ADD_FAILURE() << "rank " << m.rank() << ": no exception";
        } catch (const xshard::error& e) {
            EXPECT_EQ(std::string(e.what()),
                      "xshard: distribute: the ranks hold arrays of different shapes (dimension 0 "
                      "has extents from 5 to 6); every rank must pass the same global array")
                << "rank " << m.rank();
        }
    } else {
        EXPECT_EQ(xshard::gather_all(xshard::distribute<"[x, -]">(m, a)), a);
    }
    // An array of another rank than the layout's, on the last rank only.
    xt::xarray<double> b = odd_one ? xt::xarray<double>(xt::zeros<double>({5, 3, 1}))
                                   : xt::xarray<double>(xt::zeros<double>({5, 3}));
    try {
        (void)xshard::distribute<"[x, -]">(m, b);
        ADD_FAILURE() << "rank " << m.rank() << ": no exception";
    } catch (const xshard::error& e) {
        EXPECT_EQ(std::string(e.what()),
                  "xshard: distribute: the array of rank " + std::to_string(m.size() - 1) +
                      " has another number of dimensions than the layout [x, -] (2)")
            << "rank " << m.rank();
    }
    // Still in step: a run-time layout on the same arrays where they agree.
    const auto c = iota<double, 2>({5, 3});
    EXPECT_EQ(xshard::gather_all(xshard::distribute<dynamic_layout(2)>(m, c, layout("[-, x]"))), c);
}

TEST(dtensor, elementwise_arithmetic_is_lazy_and_local) {
    for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 2> shape{6, 7};
        std::mt19937 e(7);
        const xt::xtensor<double, 2> ga = xt::random::rand<double>(shape, -1.0, 1.0, e);
        const xt::xtensor<double, 2> gb = xt::random::rand<double>(shape, 1.0, 2.0, e);
        for (const auto& l : all_layouts(m.shape(), 2)) {
            auto a = xshard::distribute<dynamic_layout(2)>(m, ga, l);
            auto b = xshard::distribute<dynamic_layout(2)>(m, gb, l);
            if (!l.is_partial()) {
                xshard::dtensor<double, std::remove_cvref_t<decltype(m)>, dynamic_layout(2)> c =
                    a * b - 2.0 * a / b + 1.0;
                const xt::xtensor<double, 2> expected = ga * gb - 2.0 * ga / gb + 1.0;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(c), expected)) << l << " " << where(m);
            } else {
                // Linear combinations of partial(sum) tensors stay right.
                auto c = xshard::eval(-(a + b) * 0.5 - b / 4.0);
                const xt::xtensor<double, 2> expected = -(ga + gb) * 0.5 - gb / 4.0;
                EXPECT_TRUE(xt::allclose(xshard::gather_all(c), expected)) << l << " " << where(m);
                EXPECT_THROW((void)(a * b), xshard::error) << l;
                EXPECT_THROW((void)(a + 1.0), xshard::error) << l;
            }
        }
    });
}

TEST(dtensor, draws_which_rank_holds_which_block) {
    const auto m = xshard::mesh_shape::parse("dp=2,mp=2");
    EXPECT_EQ(xshard::draw_sharding(layout("[dp, mp]"), m, std::array<std::size_t, 2>{6, 5}),
              "[dp, mp] (6, 5) on mesh(dp=2, mp=2)\n"
              "+------------+------------+\n"
              "|   rank 0   |   rank 1   |\n"
              "| [0:3, 0:3] | [0:3, 3:5] |\n"
              "+------------+------------+\n"
              "|   rank 2   |   rank 3   |\n"
              "| [3:6, 0:3] | [3:6, 3:5] |\n"
              "+------------+------------+\n");
    EXPECT_EQ(
        xshard::draw_sharding(layout("[mp] partial(sum: dp)"), m, std::array<std::size_t, 1>{3}),
        "[mp] partial(sum: dp) (3,) on mesh(dp=2, mp=2)\n"
        "+-----------+-----------+\n"
        "| ranks 0,2 | ranks 1,3 |\n"
        "|   [0:2]   |   [2:3]   |\n"
        "+-----------+-----------+\n");
}

} // namespace
