// Derived datatypes beyond MPI's int: contiguous_large and subarray_datatype describe the same
// bytes as MPI's own constructors where those apply, and the right bytes where they do not.

#include <xshard/comm/datatype.hpp>
#include <xshard/comm/subarray.hpp>

#include <gtest/gtest.h>

#include <mpi.h>

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace {

/// The bytes `type` selects from `data` (MPI_Pack).
std::vector<char> packed(const void* data, MPI_Datatype type) {
    int size = 0;
    MPI_Pack_size(1, type, MPI_COMM_SELF, &size);
    std::vector<char> out(static_cast<std::size_t>(size));
    int position = 0;
    MPI_Pack(data, 1, type, out.data(), size, &position, MPI_COMM_SELF);
    out.resize(std::size_t(position));
    return out;
}

TEST(datatype, subarray_datatype_selects_what_subarray_selects) {
    std::vector<std::int32_t> array(4 * 5 * 6);
    std::iota(array.begin(), array.end(), 0);
    const std::array<std::size_t, 3> sizes{4, 5, 6}, subsizes{2, 3, 2}, starts{1, 2, 3};
    const std::array<int, 3> isizes{4, 5, 6}, isubsizes{2, 3, 2}, istarts{1, 2, 3};
    const auto mpi = xshard::derived_datatype::subarray(isizes, isubsizes, istarts, MPI_INT32_T);
    const auto ours =
        xshard::subarray_datatype(sizes, starts, subsizes, MPI_INT32_T);
    EXPECT_EQ(packed(array.data(), ours.native()), packed(array.data(), mpi.native()));
    MPI_Aint lb = 0, extent = 0, our_lb = 0, our_extent = 0;
    MPI_Type_get_extent(mpi.native(), &lb, &extent);
    MPI_Type_get_extent(ours.native(), &our_lb, &our_extent);
    EXPECT_EQ(our_lb, lb);
    EXPECT_EQ(our_extent, extent);
}

TEST(datatype, subarray_datatype_beyond_int) {
    // A box of 2 x (2^31 + 1) bytes at (1, 5) in a 3 x 2^32 array: no memory needed to check
    // which bytes the type covers.
    const std::size_t row = std::size_t(1) << 32, run = std::size_t(INT_MAX) + 2;
    const std::array<std::size_t, 2> sizes{3, row}, subsizes{2, run}, starts{1, 5};
    const auto t = xshard::subarray_datatype(sizes, starts, subsizes, MPI_BYTE);
    MPI_Count size = 0, true_lb = 0, true_extent = 0, lb = 0, extent = 0;
    MPI_Type_size_x(t.native(), &size);
    MPI_Type_get_true_extent_x(t.native(), &true_lb, &true_extent);
    MPI_Type_get_extent_x(t.native(), &lb, &extent);
    EXPECT_EQ(std::size_t(size), 2 * run);
    EXPECT_EQ(std::size_t(true_lb), row + 5);
    EXPECT_EQ(std::size_t(true_extent), row + run);
    EXPECT_EQ(lb, 0);
    EXPECT_EQ(std::size_t(extent), 3 * row);
}

TEST(datatype, contiguous_large_covers_every_element_once) {
    const std::size_t n = std::size_t(INT_MAX) + 13;
    const auto t = xshard::derived_datatype::contiguous_large(n, MPI_DOUBLE);
    MPI_Count size = 0, true_lb = 0, true_extent = 0;
    MPI_Type_size_x(t.native(), &size);
    MPI_Type_get_true_extent_x(t.native(), &true_lb, &true_extent);
    EXPECT_EQ(std::size_t(size), n * sizeof(double));
    EXPECT_EQ(true_lb, 0);
    EXPECT_EQ(std::size_t(true_extent), n * sizeof(double));
    // Below the limit it is MPI's plain contiguous type of the same signature.
    std::vector<double> v(10, 1.5);
    const auto small = xshard::derived_datatype::contiguous_large(v.size(), MPI_DOUBLE);
    EXPECT_EQ(packed(v.data(), small.native()).size(), v.size() * sizeof(double));
}

} // namespace
