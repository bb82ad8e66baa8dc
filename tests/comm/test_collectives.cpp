// Typed collectives against values computed independently on each rank.

#include <xshard/comm/collectives.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>
#include <xtensor/xtensor.hpp>

#include <complex>
#include <cstdint>
#include <numeric>
#include <vector>

namespace {

using xshard::reduction;
using xshard::testing::world;

/// The value rank `r` contributes at position `i`: distinct for every (r, i).
template <class T>
T value(int r, std::size_t i) {
    if constexpr (std::is_same_v<T, std::complex<double>> || std::is_same_v<T, std::complex<float>>)
        return T(typename T::value_type(r + 1), typename T::value_type(i % 7));
    else
        return T((r + 1) * 10 + int(i % 9));
}

template <class T>
std::vector<T> values(int r, std::size_t n) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i)
        v[i] = value<T>(r, i);
    return v;
}

template <class T>
class typed_collectives : public ::testing::Test {};
using element_types =
    ::testing::Types<int, long long, unsigned char, float, double, std::complex<double>>;
TYPED_TEST_SUITE(typed_collectives, element_types);

TYPED_TEST(typed_collectives, bcast_from_last_rank) {
    using T = TypeParam;
    const auto w = world();
    const int root = w.size() - 1;
    auto buffer = w.rank() == root ? values<T>(root, 13) : std::vector<T>(13);
    xshard::mpi::bcast(w, buffer, root);
    EXPECT_EQ(buffer, values<T>(root, 13));
}

TYPED_TEST(typed_collectives, allreduce_sum) {
    using T = TypeParam;
    const auto w = world();
    const std::size_t n = 17;
    std::vector<T> out(n);
    xshard::mpi::allreduce(w, values<T>(w.rank(), n), out, reduction::sum);
    std::vector<T> expected(n, T{});
    for (int r = 0; r < w.size(); ++r)
        for (std::size_t i = 0; i < n; ++i)
            expected[i] = T(expected[i] + value<T>(r, i));
    EXPECT_EQ(out, expected);
}

TYPED_TEST(typed_collectives, allgather_in_rank_order) {
    using T = TypeParam;
    const auto w = world();
    const std::size_t n = 5;
    std::vector<T> out(n * std::size_t(w.size()));
    xshard::mpi::allgather(w, values<T>(w.rank(), n), out);
    for (int r = 0; r < w.size(); ++r)
        for (std::size_t i = 0; i < n; ++i)
            EXPECT_EQ(out[std::size_t(r) * n + i], value<T>(r, i)) << "from rank " << r;
}

TEST(collectives, allreduce_prod_min_max) {
    const auto w = world();
    const std::vector<double> mine{double(w.rank() + 2), double(-w.rank()), 1.5};
    std::vector<double> prod(3), lo(3), hi(3);
    xshard::mpi::allreduce(w, mine, prod, reduction::prod);
    xshard::mpi::allreduce(w, mine, lo, reduction::min);
    xshard::mpi::allreduce(w, mine, hi, reduction::max);
    double expected_prod = 1;
    for (int r = 0; r < w.size(); ++r)
        expected_prod *= r + 2;
    EXPECT_EQ(prod[0], expected_prod);
    EXPECT_EQ(lo[1], -(w.size() - 1));
    EXPECT_EQ(hi[0], w.size() + 1);
    EXPECT_EQ(hi[2], 1.5);
}

TEST(collectives, allreduce_in_place_on_xtensor) {
    const auto w = world();
    xt::xtensor<double, 2> a = xt::zeros<double>({3, 4});
    for (std::size_t i = 0; i < a.size(); ++i)
        a.data()[i] = double(w.rank()) * double(i);
    xshard::mpi::allreduce(w, a, reduction::sum);
    const double ranks = double(w.size()) * (w.size() - 1) / 2.0;
    for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(a.data()[i], ranks * double(i));
}

TEST(collectives, reduce_to_root) {
    const auto w = world();
    const int root = w.size() / 2;
    std::vector<long long> out(w.rank() == root ? 4 : 0);
    xshard::mpi::reduce(w, values<long long>(w.rank(), 4), out, reduction::sum, root);
    if (w.rank() == root) {
        for (std::size_t i = 0; i < 4; ++i) {
            long long expected = 0;
            for (int r = 0; r < w.size(); ++r)
                expected += value<long long>(r, i);
            EXPECT_EQ(out[i], expected);
        }
    }
}

TEST(collectives, gather_and_scatter) {
    const auto w = world();
    const std::size_t n = 3;
    const auto p = std::size_t(w.size());
    std::vector<int> gathered(w.rank() == 0 ? n * p : 0);
    xshard::mpi::gather(w, values<int>(w.rank(), n), gathered, 0);
    if (w.rank() == 0) {
        for (std::size_t r = 0; r < p; ++r)
            for (std::size_t i = 0; i < n; ++i)
                EXPECT_EQ(gathered[r * n + i], value<int>(int(r), i));
    }

    std::vector<int> all(n * p);
    for (std::size_t r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i)
            all[r * n + i] = value<int>(int(r), i);
    std::vector<int> piece(n);
    xshard::mpi::scatter(w, w.rank() == 0 ? all : std::vector<int>{}, piece, 0);
    EXPECT_EQ(piece, values<int>(w.rank(), n));
}

/// Rank r holds r + 1 elements in the v-collectives.
struct ragged {
    std::vector<int> counts, displs;
    int total = 0;
    explicit ragged(int p) {
        for (int r = 0; r < p; ++r) {
            counts.push_back(r + 1);
            displs.push_back(total);
            total += r + 1;
        }
    }
};

TEST(collectives, gatherv_scatterv_allgatherv) {
    const auto w = world();
    const ragged layout(w.size());
    const auto mine = values<double>(w.rank(), std::size_t(w.rank() + 1));
    std::vector<double> expected;
    for (int r = 0; r < w.size(); ++r) {
        const auto v = values<double>(r, std::size_t(r + 1));
        expected.insert(expected.end(), v.begin(), v.end());
    }

    std::vector<double> gathered(w.rank() == 0 ? std::size_t(layout.total) : 0);
    xshard::mpi::gatherv(w, mine, gathered, layout.counts, layout.displs, 0);
    if (w.rank() == 0) {
        EXPECT_EQ(gathered, expected);
    }

    std::vector<double> everywhere(std::size_t(layout.total));
    xshard::mpi::allgatherv(w, mine, everywhere, layout.counts, layout.displs);
    EXPECT_EQ(everywhere, expected);

    std::vector<double> piece(std::size_t(w.rank() + 1));
    xshard::mpi::scatterv(w, expected, layout.counts, layout.displs, piece, 0);
    EXPECT_EQ(piece, mine);
}

TEST(collectives, alltoall_and_alltoallv) {
    const auto w = world();
    const auto p = std::size_t(w.size());
    const std::size_t n = 2;
    // Piece j of rank r's send: value(r, j * n + i).
    std::vector<int> received(n * p);
    xshard::mpi::alltoall(w, values<int>(w.rank(), n * p), received);
    for (std::size_t r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i)
            EXPECT_EQ(received[r * n + i], value<int>(int(r), std::size_t(w.rank()) * n + i));

    // alltoallv: rank r sends j + 1 elements to rank j, all of value 100 r + j.
    std::vector<int> sc(p), sd(p), rc(p), rd(p);
    std::vector<int> send;
    for (std::size_t j = 0; j < p; ++j) {
        sc[j] = int(j) + 1;
        sd[j] = int(send.size());
        send.insert(send.end(), j + 1, 100 * w.rank() + int(j));
    }
    int total = 0;
    for (std::size_t r = 0; r < p; ++r) {
        rc[r] = w.rank() + 1;
        rd[r] = total;
        total += rc[r];
    }
    std::vector<int> recv(std::size_t(total), -1);
    xshard::mpi::alltoallv(w, send, sc, sd, recv, rc, rd);
    for (std::size_t r = 0; r < p; ++r)
        for (int k = 0; k < rc[r]; ++k)
            EXPECT_EQ(recv[std::size_t(rd[r] + k)], 100 * int(r) + w.rank());
}

TEST(collectives, reduce_scatter_forms) {
    const auto w = world();
    const auto p = std::size_t(w.size());
    const std::size_t n = 3;
    std::vector<double> block(n);
    xshard::mpi::reduce_scatter_block(w, values<double>(w.rank(), n * p), block, reduction::sum);
    for (std::size_t i = 0; i < n; ++i) {
        double expected = 0;
        for (int r = 0; r < w.size(); ++r)
            expected += value<double>(r, std::size_t(w.rank()) * n + i);
        EXPECT_EQ(block[i], expected);
    }

    const ragged layout(w.size());
    std::vector<double> piece(std::size_t(w.rank() + 1));
    xshard::mpi::reduce_scatter(w, values<double>(w.rank(), std::size_t(layout.total)), piece,
                           layout.counts, reduction::max);
    for (std::size_t i = 0; i < piece.size(); ++i) {
        double expected = value<double>(0, std::size_t(layout.displs[std::size_t(w.rank())]) + i);
        for (int r = 1; r < w.size(); ++r)
            expected = std::max(
                expected, value<double>(r, std::size_t(layout.displs[std::size_t(w.rank())]) + i));
        EXPECT_EQ(piece[i], expected);
    }
}

TEST(point_to_point, ring_send_recv_and_sendrecv) {
    const auto w = world();
    const int next = (w.rank() + 1) % w.size();
    const int prev = (w.rank() + w.size() - 1) % w.size();
    std::vector<float> in(6);
    xshard::mpi::sendrecv(w, values<float>(w.rank(), 6), next, in, prev, 7);
    EXPECT_EQ(in, values<float>(prev, 6));

    std::vector<float> got(6);
    auto r = xshard::mpi::irecv(w, got, prev, 3);
    xshard::mpi::send(w, values<float>(w.rank(), 6), next, 3);
    r.wait();
    EXPECT_EQ(got, values<float>(prev, 6));
    std::vector<float> again(6);
    const auto mine = values<float>(w.rank(), 6);
    auto s = xshard::mpi::isend(w, mine, next, 4);
    xshard::mpi::recv(w, again, prev, 4);
    s.wait();
    EXPECT_EQ(again, values<float>(prev, 6));
}

TEST(nonblocking, collectives_complete_through_requests) {
    const auto w = world();
    const auto p = std::size_t(w.size());
    std::vector<double> sum(4), gathered(4 * p), exchanged(2 * p), scattered(2);
    std::vector<double> shared = w.rank() == 0 ? values<double>(0, 5) : std::vector<double>(5);
    const auto a = values<double>(w.rank(), 4);
    const auto b = values<double>(w.rank(), 2 * p);
    std::vector<xshard::request> pending;
    pending.push_back(xshard::mpi::iallreduce(w, a, sum, reduction::sum));
    pending.push_back(xshard::mpi::iallgather(w, a, gathered));
    pending.push_back(xshard::mpi::ialltoall(w, b, exchanged));
    pending.push_back(xshard::mpi::ireduce_scatter_block(w, b, scattered, reduction::sum));
    pending.push_back(xshard::mpi::ibcast(w, shared, 0));
    pending.push_back(xshard::mpi::ibarrier(w));
    xshard::wait_all(pending);
    for (auto& r : pending)
        EXPECT_FALSE(r.active());

    EXPECT_EQ(shared, values<double>(0, 5));
    for (std::size_t i = 0; i < 4; ++i) {
        double expected = 0;
        for (int r = 0; r < w.size(); ++r)
            expected += value<double>(r, i);
        EXPECT_EQ(sum[i], expected);
    }
    for (std::size_t r = 0; r < p; ++r) {
        EXPECT_EQ(gathered[r * 4 + 3], value<double>(int(r), 3));
        EXPECT_EQ(exchanged[r * 2 + 1], value<double>(int(r), std::size_t(w.rank()) * 2 + 1));
    }
    double expected = 0;
    for (int r = 0; r < w.size(); ++r)
        expected += value<double>(r, std::size_t(w.rank()) * 2);
    EXPECT_EQ(scattered[0], expected);
}

TEST(nonblocking, destroyed_request_is_completed) {
    const auto w = world();
    std::vector<int> out(3);
    const auto in = values<int>(w.rank(), 3);
    { auto r = xshard::mpi::iallreduce(w, in, out, reduction::max); } // the destructor waits
    EXPECT_EQ(out, values<int>(w.size() - 1, 3));
}

TEST(collectives, size_mismatch_is_an_error) {
    const auto w = world();
    std::vector<double> small(1);
    EXPECT_THROW(xshard::mpi::allreduce(w, std::vector<double>(2), small, reduction::sum),
                 xshard::error);
    std::vector<double> wrong(w.size() + 1);
    EXPECT_THROW(xshard::mpi::allgather(w, std::vector<double>(1), wrong), xshard::error);
    std::vector<std::complex<double>> z(1);
    EXPECT_THROW(xshard::mpi::allreduce(w, z, reduction::max), xshard::error);
}

} // namespace
