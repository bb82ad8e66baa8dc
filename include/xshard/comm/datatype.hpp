#pragma once
/// \file
/// MPI datatypes for C++ types.
///
/// Every arithmetic type, `std::complex<float|double|long double>`, `bool` and
/// `std::byte` map to a predefined MPI datatype. To communicate a user type, specialise
/// `xshard::datatype_traits` with a static `get()` returning a committed MPI datatype:
///
/// \code
/// struct particle { double x, y; int id; };
/// template <> struct xshard::datatype_traits<particle> : xshard::bytes_datatype<particle> {};
/// \endcode
///
/// `bytes_datatype<T>` sends a trivially copyable T as sizeof(T) bytes (fine between
/// ranks of one machine type). For a type with a real MPI layout, build it once with
/// `derived_datatype` and return its handle from `get()`. Reductions (sum, max, ...)
/// are defined only for arithmetic and complex types.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <climits>
#include <complex>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// Customisation point: `datatype_traits<T>::get()` returns the MPI datatype of T.
template <class T>
struct datatype_traits;

#define XSHARD_PREDEFINED_DATATYPE(type, mpi)                                                      \
    template <>                                                                                    \
    struct datatype_traits<type> {                                                                 \
        static MPI_Datatype get() noexcept { return mpi; }                                         \
    }

XSHARD_PREDEFINED_DATATYPE(char, MPI_CHAR);
XSHARD_PREDEFINED_DATATYPE(signed char, MPI_SIGNED_CHAR);
XSHARD_PREDEFINED_DATATYPE(unsigned char, MPI_UNSIGNED_CHAR);
XSHARD_PREDEFINED_DATATYPE(wchar_t, MPI_WCHAR);
XSHARD_PREDEFINED_DATATYPE(char8_t, MPI_UINT8_T);
XSHARD_PREDEFINED_DATATYPE(char16_t, MPI_UINT16_T);
XSHARD_PREDEFINED_DATATYPE(char32_t, MPI_UINT32_T);
XSHARD_PREDEFINED_DATATYPE(short, MPI_SHORT);
XSHARD_PREDEFINED_DATATYPE(unsigned short, MPI_UNSIGNED_SHORT);
XSHARD_PREDEFINED_DATATYPE(int, MPI_INT);
XSHARD_PREDEFINED_DATATYPE(unsigned int, MPI_UNSIGNED);
XSHARD_PREDEFINED_DATATYPE(long, MPI_LONG);
XSHARD_PREDEFINED_DATATYPE(unsigned long, MPI_UNSIGNED_LONG);
XSHARD_PREDEFINED_DATATYPE(long long, MPI_LONG_LONG);
XSHARD_PREDEFINED_DATATYPE(unsigned long long, MPI_UNSIGNED_LONG_LONG);
XSHARD_PREDEFINED_DATATYPE(float, MPI_FLOAT);
XSHARD_PREDEFINED_DATATYPE(double, MPI_DOUBLE);
XSHARD_PREDEFINED_DATATYPE(long double, MPI_LONG_DOUBLE);
XSHARD_PREDEFINED_DATATYPE(bool, MPI_CXX_BOOL);
XSHARD_PREDEFINED_DATATYPE(std::byte, MPI_BYTE);
XSHARD_PREDEFINED_DATATYPE(std::complex<float>, MPI_CXX_FLOAT_COMPLEX);
XSHARD_PREDEFINED_DATATYPE(std::complex<double>, MPI_CXX_DOUBLE_COMPLEX);
XSHARD_PREDEFINED_DATATYPE(std::complex<long double>, MPI_CXX_LONG_DOUBLE_COMPLEX);

#undef XSHARD_PREDEFINED_DATATYPE

/// A type xshard can send: `datatype_traits<T>::get()` exists.
template <class T>
concept mpi_datatype = requires {
    { datatype_traits<std::remove_cv_t<T>>::get() } -> std::same_as<MPI_Datatype>;
};

/// The MPI datatype of T.
template <mpi_datatype T>
MPI_Datatype datatype_of() noexcept {
    return datatype_traits<std::remove_cv_t<T>>::get();
}

namespace detail {

/// `n` as an MPI count, or throws `xshard::error` when it exceeds MPI's int limit.
XSHARD_DECL int to_int_count(std::size_t n);

template <class T>
struct is_complex : std::false_type {};
template <class T>
struct is_complex<std::complex<T>> : std::true_type {};
} // namespace detail

/// A type MPI can add and multiply (arithmetic or complex, not bool).
template <class T>
concept summable = mpi_datatype<T> &&(std::is_arithmetic_v<std::remove_cv_t<T>> ||
                                      detail::is_complex<std::remove_cv_t<T>>::value) &&
                   !std::same_as<std::remove_cv_t<T>, bool>;

/// A type MPI can also order (min, max): arithmetic, not complex, not bool.
template <class T>
concept ordered = summable<T> && std::is_arithmetic_v<std::remove_cv_t<T>>;

/// An owned, committed derived datatype (freed with the object, unless MPI is finalised).
class derived_datatype {
public:
    derived_datatype() = default;

    /// Adopts `type` and commits it.
    explicit derived_datatype(MPI_Datatype type)
        : type_(type) {
        detail::check_mpi(MPI_Type_commit(&type_), "MPI_Type_commit");
    }

    /// `count` consecutive elements of `element` (MPI_Type_contiguous).
    static derived_datatype contiguous(int count, MPI_Datatype element) {
        MPI_Datatype type = MPI_DATATYPE_NULL;
        detail::check_mpi(MPI_Type_contiguous(count, element, &type), "MPI_Type_contiguous");
        return derived_datatype(type);
    }

    /// `n` consecutive elements of `element` for any n, also beyond MPI's int counts: a
    /// contiguous type of int-sized chunks, plus the remainder (MPI_Type_create_struct). Its
    /// type signature is n elements of `element`, so it matches n elements sent or received
    /// one by one.
    static derived_datatype contiguous_large(std::size_t n, MPI_Datatype element) {
        constexpr std::size_t chunk = std::size_t(1) << 30;
        if (n <= std::size_t(INT_MAX))
            return contiguous(int(n), element);
        derived_datatype chunk_type = contiguous(int(chunk), element);
        derived_datatype chunks = contiguous(detail::to_int_count(n / chunk), chunk_type.native());
        const std::size_t rest = n % chunk;
        if (rest == 0)
            return chunks;
        MPI_Aint lb = 0, extent = 0;
        detail::check_mpi(MPI_Type_get_extent(element, &lb, &extent), "MPI_Type_get_extent");
        int lengths[2] = {1, int(rest)};
        MPI_Aint places[2] = {0, MPI_Aint(n / chunk * chunk) * extent};
        MPI_Datatype types[2] = {chunks.native(), element};
        MPI_Datatype type = MPI_DATATYPE_NULL;
        detail::check_mpi(MPI_Type_create_struct(2, lengths, places, types, &type),
                          "MPI_Type_create_struct");
        return derived_datatype(type);
    }

    /// Blocks of `element` at absolute addresses, for a call on MPI_BOTTOM: block i is
    /// `lengths[i]` elements at `addresses[i]` (any length, see `contiguous_large`). One
    /// collective over several buffers without packing them.
    static derived_datatype at_addresses(std::span<const std::size_t> lengths,
                                         std::span<const void* const> addresses,
                                         MPI_Datatype element) {
        std::vector<int> ones(lengths.size(), 1);
        std::vector<MPI_Aint> places(lengths.size());
        std::vector<derived_datatype> blocks;
        std::vector<MPI_Datatype> types(lengths.size());
        blocks.reserve(lengths.size());
        for (std::size_t i = 0; i < lengths.size(); ++i) {
            detail::check_mpi(MPI_Get_address(addresses[i], &places[i]), "MPI_Get_address");
            if (lengths[i] <= std::size_t(INT_MAX)) {
                ones[i] = int(lengths[i]);
                types[i] = element;
            } else {
                blocks.push_back(contiguous_large(lengths[i], element));
                types[i] = blocks.back().native();
            }
        }
        MPI_Datatype type = MPI_DATATYPE_NULL;
        detail::check_mpi(MPI_Type_create_struct(int(ones.size()), ones.data(), places.data(),
                                                 types.data(), &type),
                          "MPI_Type_create_struct");
        return derived_datatype(type);
    }

    /// The row-major box of extents `subsizes` at `starts` inside an array of extents
    /// `sizes` (MPI_Type_create_subarray, MPI_ORDER_C). Every subsize must be at least 1.
    static derived_datatype subarray(std::span<const int> sizes, std::span<const int> subsizes,
                                     std::span<const int> starts, MPI_Datatype element) {
        MPI_Datatype type = MPI_DATATYPE_NULL;
        detail::check_mpi(MPI_Type_create_subarray(int(sizes.size()), sizes.data(), subsizes.data(),
                                                   starts.data(), MPI_ORDER_C, element, &type),
                          "MPI_Type_create_subarray");
        return derived_datatype(type);
    }

    derived_datatype(derived_datatype&& other) noexcept
        : type_(std::exchange(other.type_, MPI_DATATYPE_NULL)) {}
    derived_datatype& operator=(derived_datatype&& other) noexcept {
        if (this != &other) {
            release();
            type_ = std::exchange(other.type_, MPI_DATATYPE_NULL);
        }
        return *this;
    }
    ~derived_datatype() { release(); }

    MPI_Datatype native() const noexcept { return type_; }

private:
    void release() noexcept {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (type_ != MPI_DATATYPE_NULL && !finalized)
            MPI_Type_free(&type_);
        type_ = MPI_DATATYPE_NULL;
    }

    MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

/// Base for `datatype_traits<T>` of a trivially copyable T sent as its bytes.
template <class T>
requires std::is_trivially_copyable_v<T>
struct bytes_datatype {
    static MPI_Datatype get() {
        static const derived_datatype type =
            derived_datatype::contiguous(static_cast<int>(sizeof(T)), MPI_BYTE);
        return type.native();
    }
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/datatype.ipp>
#endif
