// Plans whose reductions take the point-to-point path (comm/pairwise_reduce.hpp), forced
// onto it with tiny chunks, against serial reductions.

#include <xshard/redistribute/redistribute.hpp>
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
