#pragma once
/// \file
/// Reductions: the one vocabulary for how values combine, used by the reducing collectives
/// (`allreduce(c, buffer, reduction::sum)`), by partial layouts (`partial(max: dp)`) and by
/// xshard's own pairwise reductions; and the MPI operator of each reduction per element type.
///
/// `reduction_traits<T>::get(r)` gives the MPI_Op of `r` on elements of type T. Arithmetic
/// and complex types use MPI's predefined operators; other types (xshard's 16-bit floats,
/// comm/float16.hpp) specialise the traits with operators of their own.

#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

namespace xshard {

/// How values combine: the reduction of a reducing collective, and of the terms of a
/// partial tensor (layouts use sum, max and min).
enum class reduction : std::uint8_t { sum, max, min, prod };

/// "sum", "max", "min" or "prod" (the layout notation's word).
constexpr std::string_view to_string(reduction r) {
    switch (r) {
    case reduction::sum:
        return "sum";
    case reduction::max:
        return "max";
    case reduction::min:
        return "min";
    case reduction::prod:
        return "prod";
    }
    return "?";
}

/// Customisation point: `reduction_traits<T>::get(r)` returns the MPI operator that performs
/// `r` on elements of T (throwing `xshard::error` for a reduction T does not define).
template <class T>
struct reduction_traits;

/// MPI's predefined operators, for arithmetic and complex types (complex values have no
/// order: min and max throw).
template <summable T>
struct reduction_traits<T> {
    static MPI_Op get(reduction r) {
        if constexpr (!ordered<T>) {
            if (r == reduction::min || r == reduction::max)
                throw error("xshard: min and max are not defined for complex values");
        }
        switch (r) {
        case reduction::sum:
            return MPI_SUM;
        case reduction::prod:
            return MPI_PROD;
        case reduction::min:
            return MPI_MIN;
        case reduction::max:
            return MPI_MAX;
        }
        return MPI_OP_NULL;
    }
};

/// A type MPI can reduce: it has a datatype and `reduction_traits`.
template <class T>
concept reducible = mpi_datatype<T> && requires(reduction r) {
    { reduction_traits<std::remove_cv_t<T>>::get(r) } -> std::same_as<MPI_Op>;
};

/// The MPI operator of `r` on elements of T.
template <reducible T>
MPI_Op op_of(reduction r) {
    return reduction_traits<std::remove_cv_t<T>>::get(r);
}

/// An owned user-defined MPI reduction operator (MPI_Op_create, commutative), freed with the
/// object unless MPI is already finalised. For `reduction_traits` specialisations.
class user_op {
public:
    explicit user_op(MPI_User_function* f) {
        detail::check_mpi(MPI_Op_create(f, 1, &op_), "MPI_Op_create");
    }
    user_op(user_op&& other) noexcept
        : op_(std::exchange(other.op_, MPI_OP_NULL)) {}
    user_op& operator=(user_op&&) = delete;
    user_op(const user_op&) = delete;
    user_op& operator=(const user_op&) = delete;
    ~user_op() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && op_ != MPI_OP_NULL)
            MPI_Op_free(&op_);
    }

    MPI_Op native() const noexcept { return op_; }

private:
    MPI_Op op_ = MPI_OP_NULL;
};

} // namespace xshard
