#pragma once
/// \file
/// The definitions of what train/hsdp_options.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/hsdp_options.hpp>

namespace xshard {

XSHARD_DECL optimizer_level parse_optimizer_level(std::string_view name) {
    for (auto l : {optimizer_level::level1, optimizer_level::level2, optimizer_level::level3})
        if (name == to_string(l))
            return l;
    throw error("xshard: hsdp: optimizer_level must be one of level1, level2, level3, not '" +
                std::string(name) + "'");
}

namespace detail {

XSHARD_DECL std::optional<std::string> hsdp_options_problem(const hsdp_options& o) {
    if (!(o.shard_size == -1 || o.shard_size > 0))
        return "xshard: hsdp: shard_size must be a positive integer or -1, not " +
               std::to_string(o.shard_size);
    if (o.threshold < 0)
        return "xshard: hsdp: threshold must be an integer >= 0 (KB), not " +
               std::to_string(o.threshold);
    const int l = int(o.optimizer_level);
    if (l < 1 || l > 3)
        return "xshard: hsdp: optimizer_level must be one of level1, level2, level3, not " +
               std::to_string(l);
    return std::nullopt;
}

} // namespace detail

} // namespace xshard

