#pragma once
/// \file
/// The definitions of what param/traversal.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/param/traversal.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::string join_name(std::string_view prefix, std::string_view name) {
    if (prefix.empty())
        return std::string(name);
    return std::string(prefix) + "." + std::string(name);
}

} // namespace detail

} // namespace xshard

