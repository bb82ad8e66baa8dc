// Environment, communicators, datatypes and MPI errors as exceptions.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/environment.hpp>

#include "mpi_test.hpp"

#include <gtest/gtest.h>

#include <array>
#include <complex>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace {

using xshard::testing::world;

TEST(environment, attaches_to_a_running_mpi) {
    ASSERT_TRUE(xshard::environment::initialized());
    xshard::environment second; // MPI is already up: this one must not finalise it
    EXPECT_FALSE(second.owns_mpi());
    EXPECT_GE(static_cast<int>(second.provided()), static_cast<int>(xshard::thread_level::single));
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    EXPECT_EQ(second.world().size(), size);
}

TEST(communicator, rank_size_dup_split) {
    const auto w = world();
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    EXPECT_EQ(w.rank(), rank);
    EXPECT_EQ(w.size(), size);

    const auto copy = w.dup();
    EXPECT_FALSE(copy == w);
    EXPECT_EQ(copy.rank(), rank);
    EXPECT_EQ(copy.size(), size);

    // Even and odd ranks, the odd ones in reverse order.
    const int color = rank % 2;
    const auto half = w.split(color, color ? -rank : rank);
    EXPECT_EQ(half.size(), color ? size / 2 : (size + 1) / 2);
    EXPECT_EQ(half.rank(), color ? (size / 2 - 1) - rank / 2 : rank / 2);

    const auto only_zero = w.split(rank == 0 ? 0 : xshard::communicator::undefined);
    EXPECT_EQ(only_zero.is_null(), rank != 0);
    if (rank == 0) {
        EXPECT_EQ(only_zero.size(), 1);
    }
}

int frees = 0;
int count_free(MPI_Comm, int, void*, void*) {
    ++frees;
    return MPI_SUCCESS;
}

TEST(communicator, copies_share_the_handle_and_free_it_once) {
    int key = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, count_free, &key, nullptr);
    MPI_Comm raw = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    MPI_Comm_set_attr(raw, key, nullptr);
    frees = 0;
    {
        auto owner = xshard::communicator::adopt(raw);
        auto copy = owner;
        EXPECT_EQ(copy.native(), raw);
        { auto another = copy; }
        EXPECT_EQ(frees, 0) << "freed while copies were alive";
    }
    EXPECT_EQ(frees, 1) << "the last copy must free the communicator exactly once";
    MPI_Comm_free_keyval(&key);
}

TEST(errors, mpi_error_carries_operation_code_and_rank) {
    const auto c = world().dup(); // xshard-made: returns errors
    const std::vector<int> data{1, 2, 3};
    try {
        xshard::mpi::send(c, data, c.size() + 5); // no such rank
        FAIL() << "sending to a missing rank did not throw";
    } catch (const xshard::mpi_error& e) {
        int world_rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        EXPECT_EQ(e.operation(), "MPI_Send");
        EXPECT_EQ(e.rank(), world_rank);
        int error_class = 0;
        MPI_Error_class(e.code(), &error_class);
        EXPECT_EQ(error_class, MPI_ERR_RANK);
        const std::string what = e.what();
        EXPECT_NE(what.find("MPI_Send failed on rank " + std::to_string(world_rank)),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find(xshard::mpi_error::error_string(e.code())), std::string::npos) << what;
    }
}

template <class T>
class builtin_datatypes : public ::testing::Test {};
using all_builtin =
    ::testing::Types<char, signed char, unsigned char, wchar_t, char8_t, char16_t, char32_t, short,
                     unsigned short, int, unsigned, long, unsigned long, long long,
                     unsigned long long, float, double, long double, bool, std::byte,
                     std::complex<float>, std::complex<double>, std::complex<long double>,
                     std::int8_t, std::uint16_t, std::int64_t>;
TYPED_TEST_SUITE(builtin_datatypes, all_builtin);

TYPED_TEST(builtin_datatypes, size_matches_and_values_round_trip) {
    using T = TypeParam;
    int bytes = 0;
    MPI_Type_size(xshard::datatype_of<T>(), &bytes);
    EXPECT_EQ(std::size_t(bytes), sizeof(T));

    const auto w = world();
    const auto p = std::size_t(w.size());
    std::array<T, 2> mine{};
    auto storage = std::make_unique<T[]>(2 * p); // not std::vector: vector<bool> packs bits
    const std::span<T> all(storage.get(), 2 * p);
    const auto pattern = [](std::size_t r, std::size_t i) {
        if constexpr (std::is_same_v<T, bool>)
            return (r + i) % 2 == 1;
        else if constexpr (std::is_same_v<T, std::byte>)
            return std::byte(r * 2 + i);
        else
            return T(static_cast<unsigned char>(r * 2 + i + 1));
    };
    for (std::size_t i = 0; i < 2; ++i)
        mine[i] = pattern(std::size_t(w.rank()), i);
    xshard::mpi::allgather(w, mine, all);
    for (std::size_t r = 0; r < p; ++r)
        for (std::size_t i = 0; i < 2; ++i)
            EXPECT_TRUE(all[r * 2 + i] == pattern(r, i)) << "from rank " << r;
}

struct particle {
    double x, y;
    int id;
    friend bool operator==(const particle&, const particle&) = default;
};

} // namespace

template <>
struct xshard::datatype_traits<particle> : xshard::bytes_datatype<particle> {};

namespace {

TEST(datatypes, user_type_through_bytes_datatype) {
    static_assert(xshard::mpi_datatype<particle>);
    static_assert(!xshard::summable<particle>);
    const auto w = world();
    const particle mine{w.rank() * 1.5, -w.rank() * 0.5, w.rank()};
    std::vector<particle> all(std::size_t(w.size()));
    xshard::mpi::allgather(w, std::span(&mine, 1), all);
    for (int r = 0; r < w.size(); ++r)
        EXPECT_EQ(all[std::size_t(r)], (particle{r * 1.5, -r * 0.5, r}));
}

TEST(datatypes, concepts_classify_types) {
    static_assert(xshard::summable<double> && xshard::ordered<double>);
    static_assert(xshard::summable<std::complex<float>> && !xshard::ordered<std::complex<float>>);
    static_assert(!xshard::summable<bool> && xshard::mpi_datatype<bool>);
    static_assert(!xshard::mpi_datatype<std::string>);
    static_assert(xshard::contiguous_buffer<std::vector<int>>);
    static_assert(!xshard::output_buffer<const std::vector<int>&>);
    SUCCEED();
}

} // namespace
