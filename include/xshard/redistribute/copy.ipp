#pragma once
/// \file
/// The definitions of what redistribute/copy.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/redistribute/copy.hpp>

namespace xshard::detail {

XSHARD_DECL void stream_copy(void* to, const void* from, std::size_t n) noexcept {
#if defined(__SSE2__)
    constexpr std::size_t line = 64;
    auto* d = static_cast<std::byte*>(to);
    const auto* s = static_cast<const std::byte*>(from);
    const std::size_t head =
        std::min(n, (line - reinterpret_cast<std::uintptr_t>(d) % line) % line);
    std::memcpy(d, s, head);
    d += head, s += head, n -= head;
    std::size_t i = 0;
    for (; i + line <= n; i += line) {
#if defined(__AVX__)
        const auto* p = reinterpret_cast<const __m256i*>(s + i);
        auto* q = reinterpret_cast<__m256i*>(d + i);
        const __m256i a = _mm256_loadu_si256(p), b = _mm256_loadu_si256(p + 1);
        _mm256_stream_si256(q, a);
        _mm256_stream_si256(q + 1, b);
#else
        const auto* p = reinterpret_cast<const __m128i*>(s + i);
        auto* q = reinterpret_cast<__m128i*>(d + i);
        const __m128i a = _mm_loadu_si128(p), b = _mm_loadu_si128(p + 1),
                      c = _mm_loadu_si128(p + 2), e = _mm_loadu_si128(p + 3);
        _mm_stream_si128(q, a);
        _mm_stream_si128(q + 1, b);
        _mm_stream_si128(q + 2, c);
        _mm_stream_si128(q + 3, e);
#endif
    }
    std::memcpy(d + i, s + i, n - i);
#else
    std::memcpy(to, from, n);
#endif
}

XSHARD_DECL void stream_fence() noexcept {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

} // namespace xshard::detail

