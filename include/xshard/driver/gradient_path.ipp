#pragma once
/// \file
/// The definitions of what driver/gradient_path.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/driver/gradient_path.hpp>

namespace xshard {

XSHARD_DECL gradient_path parse_gradient_path(std::string_view name) {
    for (auto p :
         {gradient_path::automatic, gradient_path::all_reduce, gradient_path::sharded_update})
        if (name == to_string(p))
            return p;
    throw error("xshard: gradient_path must be one of automatic, all_reduce, sharded_update, "
                "not '" +
                std::string(name) + "'");
}

XSHARD_DECL hsdp_options sharded_update_options(const machine_model& machine) {
    return {.shard_size = -1,
            .threshold = std::int64_t(machine.hsdp_threshold_bytes / 1024),
            .optimizer_level = optimizer_level::level2};
}

} // namespace xshard

