#pragma once
/// \file
/// A fixed-capacity vector that is a structural literal type (usable as, and inside, a
/// C++20 class-type template argument) and works in constant expressions.

#include <array>
#include <cstddef>
#include <initializer_list>
#include <stdexcept>

namespace xshard {

/// Up to N values of T in place. Members are public because structural types need them
/// to be; use the member functions.
template <class T, std::size_t N>
struct static_vector {
    std::array<T, N> items{};
    std::size_t count = 0;

    constexpr static_vector() = default;
    constexpr static_vector(std::initializer_list<T> values) {
        for (const T& v : values)
            push_back(v);
    }

    static constexpr std::size_t capacity() noexcept { return N; }
    constexpr std::size_t size() const noexcept { return count; }
    constexpr bool empty() const noexcept { return count == 0; }

    constexpr void push_back(const T& value) {
        if (count == N)
            throw std::length_error("xshard: static_vector capacity exceeded");
        items[count++] = value;
    }
    constexpr void pop_back() { --count; }
    constexpr void clear() noexcept { count = 0; }

    constexpr T& operator[](std::size_t i) { return items[i]; }
    constexpr const T& operator[](std::size_t i) const { return items[i]; }
    constexpr T& back() { return items[count - 1]; }
    constexpr const T& back() const { return items[count - 1]; }

    constexpr T* begin() noexcept { return items.data(); }
    constexpr T* end() noexcept { return items.data() + count; }
    constexpr const T* begin() const noexcept { return items.data(); }
    constexpr const T* end() const noexcept { return items.data() + count; }
    constexpr T* data() noexcept { return items.data(); }
    constexpr const T* data() const noexcept { return items.data(); }

    /// Whether `value` is an element.
    constexpr bool contains(const T& value) const {
        for (const T& v : *this)
            if (v == value)
                return true;
        return false;
    }

    /// Elementwise equality over the used elements (unused slots do not count).
    friend constexpr bool operator==(const static_vector& a, const static_vector& b) {
        if (a.count != b.count)
            return false;
        for (std::size_t i = 0; i < a.count; ++i)
            if (!(a.items[i] == b.items[i]))
                return false;
        return true;
    }
};

} // namespace xshard
