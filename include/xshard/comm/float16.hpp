#pragma once
/// \file
/// 16-bit floating-point storage types for gradients: `float16` (IEEE 754 binary16) and
/// `bfloat16` (the upper half of a binary32).
///
/// Debian 12 packages no half-precision type that xtensor or MPI know, so xshard keeps two
/// small ones of its own: storage only, conversion to and from `float` with
/// round-to-nearest-even, arithmetic through `float` (so that xtensor expressions work on
/// them), and MPI datatypes (16-bit words) with reduction operators (sum, max, min) that
/// add in float and round back to 16 bits. Gradient synchronisation can communicate them in
/// their own type or, with `fp32_communication`, in float32.

#include <xshard/comm/datatype.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/reduction.hpp>

#include <mpi.h>

#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <ostream>

namespace xshard {

namespace detail {

/// binary32 -> binary16 bits, round to nearest even; overflow to infinity, NaN kept.
constexpr std::uint16_t half_from_float(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) // inf or NaN
        return std::uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    if (abs >= 0x477ff000u) // rounds to >= 65520: overflow
        return std::uint16_t(sign | 0x7c00u);
    if (abs < 0x38800000u) { // below the smallest normal half: subnormal or zero
        const std::uint32_t shift = 126u - (abs >> 23);
        if (shift > 24)
            return std::uint16_t(sign);
        const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
        std::uint32_t half = mantissa >> shift;
        const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
        const std::uint32_t halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (half & 1u)))
            ++half;
        return std::uint16_t(sign | half);
    }
    std::uint32_t half = ((abs - 0x38000000u) >> 13);
    const std::uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
        ++half;
    return std::uint16_t(sign | half);
}

/// binary16 bits -> binary32 (exact).
constexpr float half_to_float(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f)
        return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        if (mantissa == 0)
            return std::bit_cast<float>(sign);
        int e = -1; // normalise the subnormal
        do {
            ++e;
            mantissa <<= 1;
        } while ((mantissa & 0x400u) == 0);
        return std::bit_cast<float>(sign | std::uint32_t(127 - 15 - e) << 23 |
                                    (mantissa & 0x3ffu) << 13);
    }
    return std::bit_cast<float>(sign | (exponent + 127 - 15) << 23 | mantissa << 13);
}

/// binary32 -> bfloat16 bits, round to nearest even; NaN kept.
constexpr std::uint16_t bfloat_from_float(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return std::uint16_t((x >> 16) | 0x40u);
    return std::uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

constexpr float bfloat_to_float(std::uint16_t b) {
    return std::bit_cast<float>(std::uint32_t(b) << 16);
}

/// A 16-bit float type: storage plus conversions; arithmetic goes through float.
template <class Tag, std::uint16_t (*From)(float), float (*To)(std::uint16_t)>
struct float16_base {
    std::uint16_t bits = 0;

    constexpr float16_base() = default;
    constexpr float16_base(float f)
        : bits(From(f)) {}
    constexpr float16_base(double d)
        : bits(From(float(d))) {}
    constexpr float16_base(int i)
        : bits(From(float(i))) {}
    constexpr operator float() const { return To(bits); }

    static constexpr float16_base from_bits(std::uint16_t b) {
        float16_base x;
        x.bits = b;
        return x;
    }

    friend constexpr float16_base operator+(float16_base a, float16_base b) {
        return float(a) + float(b);
    }
    friend constexpr float16_base operator-(float16_base a, float16_base b) {
        return float(a) - float(b);
    }
    friend constexpr float16_base operator*(float16_base a, float16_base b) {
        return float(a) * float(b);
    }
    friend constexpr float16_base operator/(float16_base a, float16_base b) {
        return float(a) / float(b);
    }
    friend constexpr float16_base operator-(float16_base a) { return -float(a); }
    constexpr float16_base& operator+=(float16_base b) { return *this = *this + b; }
    constexpr float16_base& operator-=(float16_base b) { return *this = *this - b; }
    constexpr float16_base& operator*=(float16_base b) { return *this = *this * b; }
    constexpr float16_base& operator/=(float16_base b) { return *this = *this / b; }
    friend constexpr bool operator==(float16_base a, float16_base b) {
        return float(a) == float(b);
    }
    friend constexpr bool operator<(float16_base a, float16_base b) { return float(a) < float(b); }
    friend constexpr bool operator>(float16_base a, float16_base b) { return float(a) > float(b); }
    friend std::ostream& operator<<(std::ostream& os, float16_base x) { return os << float(x); }
};

struct half_tag {};
struct bfloat_tag {};

} // namespace detail

/// IEEE 754 binary16: 1 sign bit, 5 exponent bits, 10 mantissa bits (about 3 decimal digits,
/// up to 65504).
using float16 =
    detail::float16_base<detail::half_tag, detail::half_from_float, detail::half_to_float>;
/// bfloat16: the upper 16 bits of a binary32 (float's range, about 2 decimal digits).
using bfloat16 =
    detail::float16_base<detail::bfloat_tag, detail::bfloat_from_float, detail::bfloat_to_float>;

/// Whether T is one of xshard's 16-bit float types.
template <class T>
concept sixteen_bit_float = std::same_as<T, float16> || std::same_as<T, bfloat16>;

template <>
struct datatype_traits<float16> {
    static MPI_Datatype get() noexcept { return MPI_UINT16_T; }
};
template <>
struct datatype_traits<bfloat16> {
    static MPI_Datatype get() noexcept { return MPI_UINT16_T; }
};

namespace detail {

/// inout[i] = in[i] (R) inout[i], computed in float and rounded back to 16 bits.
template <class T, reduction R>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const T*>(in);
    auto* b = static_cast<T*>(inout);
    for (int i = 0; i < *len; ++i) {
        const float x = float(a[i]), y = float(b[i]);
        b[i] = R == reduction::sum   ? T(x + y)
               : R == reduction::prod ? T(x * y)
               : R == reduction::max  ? T(x > y ? x : y)
                                      : T(x < y ? x : y);
    }
}

} // namespace detail

/// The reductions of the 16-bit floats: xshard's own MPI operators (adding in float,
/// rounding back), created once per process.
template <sixteen_bit_float T>
struct reduction_traits<T> {
    static MPI_Op get(reduction r) {
        static const user_op sum(detail::reduce_16bit<T, reduction::sum>);
        static const user_op max(detail::reduce_16bit<T, reduction::max>);
        static const user_op min(detail::reduce_16bit<T, reduction::min>);
        static const user_op prod(detail::reduce_16bit<T, reduction::prod>);
        switch (r) {
        case reduction::sum:
            return sum.native();
        case reduction::max:
            return max.native();
        case reduction::min:
            return min.native();
        case reduction::prod:
            return prod.native();
        }
        return MPI_OP_NULL;
    }
};

} // namespace xshard
