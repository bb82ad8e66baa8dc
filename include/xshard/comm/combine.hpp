#pragma once
/// \file
/// The local step of every reduction xshard runs itself: `combine(out, a, b, n, op)`, one
/// element-wise reduction of two buffers, and `scale`, a mean's division, both vectorised by
/// xsimd for the types it can load.

#include <xshard/comm/datatype.hpp>
#include <xshard/comm/reduction.hpp>

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace xshard {

namespace detail {

/// The floating types the vectorised passes (xsimd) compute in: float and double.
template <class T>
constexpr bool simd_floating = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// The types the vectorised reductions take: simd_floating ones and 32- and 64-bit integers.
template <class T>
constexpr bool simd_reducible =
    simd_floating<T> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::uint64_t>;

template <class T>
T combine_one(T a, T b, reduction op) {
    switch (op) {
    case reduction::sum:
        return T(a + b);
    case reduction::prod:
        return T(a * b);
    case reduction::max:
        if constexpr (!is_complex<T>::value) // complex values have no order (op_of rejects it)
            return std::max(a, b);
        break;
    case reduction::min:
        if constexpr (!is_complex<T>::value)
            return std::min(a, b);
        break;
    }
    return a;
}

} // namespace detail

/// out[i] = a[i] (op) b[i] for i < n; `out` may alias `a` or `b`. No communication.
template <class T>
void combine(T* out, const T* a, const T* b, std::size_t n, reduction op) {
    std::size_t i = 0;
    if constexpr (detail::simd_reducible<T>) {
        using batch = xsimd::batch<T>;
        constexpr std::size_t w = batch::size;
        const std::size_t vec_end = n - n % w;
        auto run = [&](auto f) {
            for (; i < vec_end; i += w)
                f(batch::load_unaligned(a + i), batch::load_unaligned(b + i))
                    .store_unaligned(out + i);
        };
        switch (op) {
        case reduction::sum:
            run([](batch x, batch y) { return x + y; });
            break;
        case reduction::prod:
            run([](batch x, batch y) { return x * y; });
            break;
        case reduction::max:
            run([](batch x, batch y) { return xsimd::max(x, y); });
            break;
        case reduction::min:
            run([](batch x, batch y) { return xsimd::min(x, y); });
            break;
        }
    }
    for (; i < n; ++i)
        out[i] = detail::combine_one(a[i], b[i], op);
}

/// p[i] *= factor for i < n. No communication.
template <class T>
void scale(T* p, std::size_t n, T factor) {
    std::size_t i = 0;
    if constexpr (detail::simd_floating<T>) {
        using batch = xsimd::batch<T>;
        const batch f(factor);
        for (const std::size_t vec_end = n - n % batch::size; i < vec_end; i += batch::size)
            (batch::load_unaligned(p + i) * f).store_unaligned(p + i);
    }
    for (; i < n; ++i)
        p[i] *= factor;
}

} // namespace xshard
