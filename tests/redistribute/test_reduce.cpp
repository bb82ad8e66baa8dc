// The point-to-point reductions, forced onto their pipelined path with tiny chunks, against
// serial reductions; and plans whose reductions take that path.

#include <xshard/redistribute/redistribute.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using xshard::reduction;
using xshard::testing::world;

template <class T>
T term(int rank, std::size_t i) {
    return T(int((i * 31 + std::size_t(rank) * 17) % 23) - 11);
}

template <class T>
class pairwise_reduction : public ::testing::Test {};
using reduced_types = ::testing::Types<double, float, std::int64_t, int>;
TYPED_TEST_SUITE(pairwise_reduction, reduced_types);

TYPED_TEST(pairwise_reduction, all_reduce_matches_a_serial_reduction) {
    using T = TypeParam;
    const auto w = world();
    // Every message takes the point-to-point path, in chunks of 8 elements.
    xshard::reducer<T> r(xshard::reduce_tuning{0, 8 * sizeof(T)});
    for (std::size_t n : {0, 1, 3, 7, 8, 9, 64, 1000, 4099}) {
        for (auto op : {reduction::sum, reduction::max, reduction::min}) {
            std::vector<T> in(n), out(n), expected(n);
            for (std::size_t i = 0; i < n; ++i) {
                in[i] = term<T>(w.rank(), i);
                expected[i] = term<T>(0, i);
                for (int q = 1; q < w.size(); ++q)
                    expected[i] = xshard::detail::combine_one(expected[i], term<T>(q, i), op);
            }
            r.all_reduce(w, in.data(), out.data(), n, op);
            EXPECT_EQ(out, expected) << "n " << n << " op " << xshard::to_string(op);
            r.all_reduce(w, in.data(), in.data(), n, op); // in place
            EXPECT_EQ(in, expected) << "in place, n " << n;
        }
    }
}

TEST(pairwise_reduction, combine_vectorises_every_operation) {
    std::vector<double> a(37), b(37), out(37);
    for (std::size_t i = 0; i < a.size(); ++i) {
        a[i] = double(i) - 18;
        b[i] = 18 - 2.0 * double(i);
    }
    xshard::combine(out.data(), a.data(), b.data(), a.size(), reduction::sum);
    for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(out[i], a[i] + b[i]);
    xshard::combine(out.data(), a.data(), b.data(), a.size(), reduction::max);
    for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(out[i], std::max(a[i], b[i]));
    xshard::combine(out.data(), a.data(), b.data(), a.size(), reduction::min);
    for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(out[i], std::min(a[i], b[i]));
}

TEST(pairwise_reduction, plans_reduce_in_chunks_with_strided_pieces) {
    xshard::testing::for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 2> shape{11, 37};
        const xshard::reduce_tuning tiny{0, 64};
        // A pending sum scattered into dimension 1 (strided pieces, one message each) and
        // into dimension 0 (contiguous, pipelined), and all-reduced.
        for (const char* to : {"[-, x]", "[x, -]", "[-, -]"}) {
            if (m.shape().ndim() != 1)
                return;
            const xshard::layout l = to;
            const int p = m.shape().group_rank(m.rank(), m.shape().all_axes());
            auto local = xt::xtensor<double, 2>::from_shape(shape);
            for (std::size_t i = 0; i < local.size(); ++i)
                local.data()[i] = term<double>(p, i);
            const auto src =
                xshard::from_local(m, shape, local, xshard::layout("[-, -] partial(sum: x)"));
            auto plan = xshard::make_redistribution<xshard::dynamic_layout(2)>(src, l, {}, tiny);
            auto expected = xt::xtensor<double, 2>::from_shape(shape);
            for (std::size_t i = 0; i < expected.size(); ++i) {
                expected.data()[i] = 0;
                for (int q = 0; q < m.size(); ++q)
                    expected.data()[i] += term<double>(q, i);
            }
            EXPECT_EQ(xshard::gather_all(plan(src)), expected)
                << to << " " << xshard::testing::where(m);
            EXPECT_EQ(plan.plan().bytes_sent(), plan.plan().summary().bytes_sent()) << to;
            EXPECT_EQ(plan.plan().allocations().peak, plan.plan().summary().peak_extra_bytes) << to;
        }
    });
}

} // namespace
