#pragma once
/// \file
/// Mesh axis names: compile-time strings (`fixed_string`, for template arguments such as
/// `mesh<"dp", "mp">`) and the structural value that layouts and mesh shapes store
/// (`axis_name`), plus sets of mesh axes.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

namespace xshard {

/// Longest axis name, in characters.
inline constexpr std::size_t max_axis_name_length = 15;
/// Most axes a mesh can have.
inline constexpr std::size_t max_mesh_axes = 6;

/// A string literal as a template argument: `mesh<"dp", "mp">`.
template <std::size_t N>
struct fixed_string {
    char chars[N]{};
    constexpr fixed_string(const char (&text)[N]) { std::copy_n(text, N, chars); }
    constexpr std::string_view view() const { return {chars, N - 1}; }
};

/// Whether `name` can name an axis: 1 to 15 characters, letters, digits and underscores,
/// not starting with a digit.
constexpr bool is_valid_axis_name(std::string_view name) {
    if (name.empty() || name.size() > max_axis_name_length)
        return false;
    if (name[0] >= '0' && name[0] <= '9')
        return false;
    return std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_';
    });
}

/// The name of a mesh axis, stored in place (a structural literal type).
struct axis_name {
    char text[max_axis_name_length + 1]{};

    constexpr axis_name() = default;
    constexpr axis_name(std::string_view name) {
        if (!is_valid_axis_name(name))
            throw std::invalid_argument("xshard: an axis name must be 1 to 15 letters, digits "
                                        "or underscores, not starting with a digit");
        std::copy(name.begin(), name.end(), text);
    }
    constexpr axis_name(const char* name)
        : axis_name(std::string_view(name)) {}

    constexpr std::string_view view() const {
        std::size_t n = 0;
        while (n < max_axis_name_length && text[n] != '\0')
            ++n;
        return {text, n};
    }

    /// Equal names (the unused characters are zero, so the whole arrays compare).
    friend constexpr bool operator==(const axis_name& a, const axis_name& b) {
        for (std::size_t i = 0; i <= max_axis_name_length; ++i)
            if (a.text[i] != b.text[i])
                return false;
        return true;
    }
};

/// A set of mesh axes, by index (bit i = axis i of the mesh).
struct axis_set {
    std::uint32_t bits = 0;

    static constexpr axis_set of(std::size_t axis) { return {std::uint32_t(1) << axis}; }
    /// The first `n` axes.
    static constexpr axis_set first(std::size_t n) { return {(std::uint32_t(1) << n) - 1}; }

    constexpr bool contains(std::size_t axis) const { return (bits >> axis) & 1U; }
    constexpr bool empty() const { return bits == 0; }
    constexpr std::size_t size() const { return std::size_t(std::popcount(bits)); }
    constexpr axis_set with(std::size_t axis) const { return {bits | (std::uint32_t(1) << axis)}; }
    constexpr axis_set without(std::size_t axis) const {
        return {bits & ~(std::uint32_t(1) << axis)};
    }

    friend constexpr axis_set operator|(axis_set a, axis_set b) { return {a.bits | b.bits}; }
    friend constexpr axis_set operator&(axis_set a, axis_set b) { return {a.bits & b.bits}; }
    friend constexpr axis_set operator-(axis_set a, axis_set b) { return {a.bits & ~b.bits}; }
    friend constexpr bool operator==(axis_set, axis_set) = default;
};

} // namespace xshard
