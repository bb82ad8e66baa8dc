// The point-to-point reductions, forced onto their pipelined path with tiny chunks, against
// serial reductions; the bytes they send are counted at the MPI boundary (support/traffic.hpp):
// an all-reduce hands every element's terms to its owner and the reduced element to the
// p - 1 others, 2 (p - 1) n in all.

#include <xshard/comm/combine.hpp>
#include <xshard/comm/pairwise_reduce.hpp>

#include "mpi_test.hpp"
#include "traffic.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace {

using xshard::reduction;
using xshard::testing::world;
namespace traffic = xshard::testing::traffic;
using traffic::total;

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
            traffic::reset();
            const auto reported = r.all_reduce(w, in.data(), out.data(), n, op);
            const auto sent = traffic::sent();
            EXPECT_EQ(out, expected) << "n " << n << " op " << xshard::to_string(op);
            // The pairwise path (n >= p) sends point to point, exactly what it reports;
            // below it MPI_Allreduce sends nothing through MPI_Isend.
            const auto p = std::size_t(w.size());
            const bool pairwise = p > 1 && n >= p;
            if (pairwise) {
                EXPECT_EQ(sent, reported) << "n " << n;
            }
            EXPECT_EQ(total(w, sent), pairwise ? 2 * (p - 1) * n * sizeof(T) : 0) << "n " << n;
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

} // namespace
