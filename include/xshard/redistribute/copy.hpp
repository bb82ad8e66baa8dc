#pragma once
/// \file
/// Boxes inside local shards: where they sit in memory, and copying between shards.

#include <xshard/compiled.hpp>
#include <xshard/core/partition.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#if defined(__AVX__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace xshard::detail {

/// Row-major strides (in elements) of an array of `shape`.
template <std::size_t N>
constexpr std::array<std::size_t, N> strides_of(const std::array<std::size_t, N>& shape) {
    std::array<std::size_t, N> s{};
    std::size_t stride = 1;
    for (std::size_t d = N; d-- > 0;) {
        s[d] = stride;
        stride *= shape[d];
    }
    return s;
}

/// The offset (in elements) of `region`'s first element in an array of `shape` whose
/// element 0 is at global `origin`.
template <std::size_t N>
constexpr std::size_t offset_in(const std::array<std::size_t, N>& shape,
                                const std::array<std::size_t, N>& origin, const box<N>& region) {
    const auto s = strides_of(shape);
    std::size_t off = 0;
    for (std::size_t d = 0; d < N; ++d)
        off += (region.offset[d] - origin[d]) * s[d];
    return off;
}

/// Whether `region` occupies one contiguous run of an array of `shape` (leading extents of
/// 1, then one dimension partly, then every later dimension whole).
template <std::size_t N>
constexpr bool is_contiguous_in(const std::array<std::size_t, N>& shape, const box<N>& region) {
    std::size_t d = 0;
    while (d < N && region.extent[d] == 1)
        ++d;
    for (std::size_t j = d + 1; j < N; ++j)
        if (region.extent[j] != shape[j])
            return false;
    return true;
}

/// Calls `f(to_run, from_run, elements)` for every contiguous run of `region` (global
/// coordinates) in an array of shape `from_shape` whose element 0 is at global `from_origin`
/// and in one of shape `to_shape` at `to_origin`. Runs along the trailing whole dimensions
/// are merged, so a region that is contiguous on both sides is one call.
template <class T, class U, std::size_t N, class F>
void for_each_run(const T* from, const std::array<std::size_t, N>& from_shape,
                  const std::array<std::size_t, N>& from_origin, U* to,
                  const std::array<std::size_t, N>& to_shape,
                  const std::array<std::size_t, N>& to_origin, const box<N>& region, F&& f) {
    if (region.empty())
        return;
    if constexpr (N == 0) {
        f(to, from, std::size_t(1));
    } else {
        // The innermost run: the last dimension, merged with whole trailing dimensions.
        std::size_t inner = N - 1;
        std::size_t run = region.extent[N - 1];
        while (inner > 0 && region.extent[inner] == from_shape[inner] &&
               region.extent[inner] == to_shape[inner]) {
            --inner;
            run *= region.extent[inner];
        }
        const auto fs = strides_of(from_shape), ts = strides_of(to_shape);
        const T* src = from + offset_in(from_shape, from_origin, region);
        U* dst = to + offset_in(to_shape, to_origin, region);
        std::array<std::size_t, N> idx{};
        const std::size_t outer = region.size() / run;
        for (std::size_t k = 0; k < outer; ++k) {
            std::size_t fo = 0, to_off = 0;
            for (std::size_t d = 0; d < inner; ++d) {
                fo += idx[d] * fs[d];
                to_off += idx[d] * ts[d];
            }
            f(dst + to_off, src + fo, run);
            for (std::size_t d = inner; d-- > 0;) {
                if (++idx[d] < region.extent[d])
                    break;
                idx[d] = 0;
            }
        }
    }
}

/// Copies `region` (global coordinates) from an array of shape `from_shape` whose element 0
/// is at global `from_origin` into one of shape `to_shape` at `to_origin`: one memcpy per
/// contiguous run (see `for_each_run`).
template <class T, std::size_t N>
void copy_region(const T* from, const std::array<std::size_t, N>& from_shape,
                 const std::array<std::size_t, N>& from_origin, T* to,
                 const std::array<std::size_t, N>& to_shape,
                 const std::array<std::size_t, N>& to_origin, const box<N>& region) {
    for_each_run(from, from_shape, from_origin, to, to_shape, to_origin, region,
                 [](T* d, const T* s, std::size_t n) { std::memcpy(d, s, n * sizeof(T)); });
}

/// Copies `n` bytes with non-temporal stores where the CPU has them (AVX, else SSE2): the
/// destination is written without first being read into the cache (a cached store reads
/// every line it writes), which pays for destinations far larger than the cache, that
/// nobody reads soon. The stores fill whole cache lines: the head up to the destination's
/// next 64-byte boundary is an ordinary copy, so that a run whose destination is not
/// line-aligned (rows of an odd width) never leaves a write-combining buffer half full (a
/// half-written line is flushed as partial writes, which measured slower than cached
/// stores). The stores are weakly ordered: `stream_fence()` before another thread may read
/// them.
XSHARD_DECL void stream_copy(void* to, const void* from, std::size_t n) noexcept;

/// Orders the non-temporal stores of `stream_copy` before the stores that follow (a barrier
/// that lets other threads read them).
XSHARD_DECL void stream_fence() noexcept;

/// `copy_region` through `stream_copy` when `streaming`.
template <class T, std::size_t N>
void copy_region(const T* from, const std::array<std::size_t, N>& from_shape,
                 const std::array<std::size_t, N>& from_origin, T* to,
                 const std::array<std::size_t, N>& to_shape,
                 const std::array<std::size_t, N>& to_origin, const box<N>& region,
                 bool streaming) {
    if (!streaming)
        return copy_region(from, from_shape, from_origin, to, to_shape, to_origin, region);
    for_each_run(from, from_shape, from_origin, to, to_shape, to_origin, region,
                 [](T* d, const T* s, std::size_t n) { stream_copy(d, s, n * sizeof(T)); });
}

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/redistribute/copy.ipp>
#endif
