// Plans whose reductions take the point-to-point path (comm/pairwise_reduce.hpp), forced onto
// it with tiny chunks, against serial reductions. The bytes they send are counted at the MPI
// boundary and checked against what a reduction must move: every term of an element travels
// once to the element's owner (reduce-scatter: (p - 1) n in all), and an all-reduce then
// hands every reduced element to the p - 1 others (2 (p - 1) n in all).

#include <xshard/redistribute/redistribute.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/gather.hpp>

#include "layouts.hpp"
#include "mpi_test.hpp"
#include "traffic.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using xshard::reduction;
using xshard::testing::world;
namespace traffic = xshard::testing::traffic;
using traffic::total;

/// The bytes the members of `c` sent to this rank since `traffic::reset()`.
unsigned long long bytes_received(const xshard::communicator& c) {
    auto sent = traffic::sent_to();
    xshard::mpi::allreduce(c, std::span(sent.data(), sent.size()), xshard::reduction::sum);
    return sent[std::size_t(world().rank())];
}

template <class T>
T term(int rank, std::size_t i) {
    return T(int((i * 31 + std::size_t(rank) * 17) % 23) - 11);
}

TEST(pairwise_reduction, plans_reduce_in_chunks_with_strided_pieces) {
    xshard::testing::for_each_mesh([](const auto& m) {
        const std::array<std::size_t, 2> shape{11, 37};
        const xshard::reduce_tuning tiny{
            .min_piece_bytes = 0, .chunk_bytes = 64, .reduce_scatter_min_piece_bytes = 0};
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
            traffic::reset();
            const auto out = plan(src);
            const auto sent = traffic::sent();
            const auto received = bytes_received(m.comm());
            EXPECT_EQ(sent, plan.plan().bytes_sent()) << to;
            EXPECT_EQ(xshard::gather_all(out), expected) << to << " " << xshard::testing::where(m);
            EXPECT_EQ(plan.plan().bytes_sent(), plan.plan().summary().bytes_sent()) << to;
            // Reduce-scatter: a rank receives the p - 1 other terms of each element it
            // holds; all-reduce: 2 (p - 1) n sent in all.
            const std::size_t n = expected.size(), members = std::size_t(m.size());
            if (l.is_fully_replicated()) {
                EXPECT_EQ(total(m.comm(), sent), 2 * (members - 1) * n * sizeof(double)) << to;
            } else {
                EXPECT_EQ(received,
                          (members - 1) * sizeof(double) *
                              xshard::testing::elements_held(m.shape(), shape, l, m.rank()))
                    << to << " " << xshard::testing::where(m);
            }
            EXPECT_EQ(plan.plan().allocations().peak, plan.plan().summary().peak_extra_bytes) << to;
        }
    });
}

/// One case of short_pieces_go_to_mpi_exactly: a pending sum of `shape` reduced into each
/// layout through MPI's collectives, against the serial sum and the pairwise path.
template <class Mesh>
void short_pieces_case(const Mesh& m, const std::array<std::size_t, 3>& shape) {
    const xshard::reduce_tuning to_mpi{.min_piece_bytes = SIZE_MAX,
                                       .reduce_scatter_min_piece_bytes = SIZE_MAX};
    const xshard::reduce_tuning pairwise{.min_piece_bytes = 0, .reduce_scatter_min_piece_bytes = 0};
    const int p = m.shape().group_rank(m.rank(), m.shape().all_axes());
    auto local = xt::xtensor<long long, 3>::from_shape(shape);
    for (std::size_t i = 0; i < local.size(); ++i)
        local.data()[i] = term<long long>(p, i);
    const auto src =
        xshard::from_local(m, shape, local, xshard::layout("[-, -, -] partial(sum: x)"));
    auto expected = xt::xtensor<long long, 3>::from_shape(shape);
    for (std::size_t i = 0; i < expected.size(); ++i) {
        expected.data()[i] = 0;
        for (int q = 0; q < m.size(); ++q)
            expected.data()[i] += term<long long>(q, i);
    }
    for (const char* to : {"[x, -, -]", "[-, x, -]", "[-, -, x]", "[-, -, -]"}) {
        const xshard::layout l = to;
        auto plan = xshard::make_redistribution<xshard::dynamic_layout(3)>(src, l, {}, to_mpi);
        const auto out = plan(src);
        const std::string what =
            std::string(to) + " rows " + std::to_string(shape[0]) + " " + xshard::testing::where(m);
        EXPECT_EQ(xshard::gather_all(out), expected) << what << plan.describe();
        EXPECT_EQ(plan.plan().bytes_sent(), plan.plan().summary().bytes_sent()) << what;
        EXPECT_EQ(plan.plan().allocations().peak, plan.plan().summary().peak_extra_bytes) << what;
        // Pieces that are runs: one reduce-scatter, read in place (no scratch); on one rank
        // the two layouts give the same block, and nothing runs.
        if (std::string(to) == "[x, -, -]") {
            const auto& steps = plan.plan().summary().steps;
            ASSERT_EQ(steps.size(), m.size() > 1 ? 1u : 0u) << what << plan.describe();
            if (!steps.empty()) {
                EXPECT_EQ(steps[0].planned.kind, xshard::step_kind::reduce_scatter) << what;
            }
            EXPECT_EQ(plan.plan().allocations().peak, 0u) << what;
        }
        auto again = out;
        const auto allocations = plan.plan().allocations().allocations;
        plan.execute(src, again);
        EXPECT_EQ(plan.plan().allocations().allocations, allocations) << what;
        EXPECT_EQ(again.local(), out.local()) << what;
        auto other = xshard::make_redistribution<xshard::dynamic_layout(3)>(src, l, {}, pairwise);
        EXPECT_EQ(other(src).local(), out.local()) << what;
    }
}

TEST(pairwise_reduction, short_pieces_go_to_mpi_exactly) {
    // Below the crossover a reduce-scatter whose pieces are runs of the block (dimension 0)
    // goes to MPI's collective, reading them in place; strided pieces (dimensions 1 and 2) stay
    // on the pairwise path (or the plan routes around them); an all-reduce is MPI_Allreduce.
    // Each against the serial sum, with the plan's allocations and bytes as its summary says;
    // the same plans through the pairwise path agree.
    // 7 rows: pieces of unequal counts (MPI_Reduce_scatter) on most rank counts; 24 rows:
    // equal ones (MPI_Reduce_scatter_block) on 1, 2, 3, 4, 6 and 8 ranks.
    xshard::testing::for_each_mesh([](const auto& m) {
        if (m.shape().ndim() != 1)
            return;
        for (const std::size_t rows : {std::size_t(7), std::size_t(24)})
            short_pieces_case(m, std::array<std::size_t, 3>{rows, 9, 5});
    });
}

} // namespace
