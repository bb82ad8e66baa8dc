#pragma once
/// \file
/// The definitions of what comm/node.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/node.hpp>

namespace xshard {

XSHARD_DECL bool shared_memory_allowed() noexcept {
    const char* v = std::getenv("XSHARD_SHARED_MEMORY");
    if (!v)
        return true;
    const std::string_view s(v);
    return !(s == "0" || s == "off" || s == "no" || s == "false");
}

} // namespace xshard

