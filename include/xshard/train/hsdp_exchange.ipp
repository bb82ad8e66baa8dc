#pragma once
/// \file
/// The definitions of what train/hsdp_exchange.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/hsdp_exchange.hpp>

namespace xshard::detail {

XSHARD_DECL std::vector<hsdp_exchange>
plan_hsdp_exchanges_by_type(std::vector<hsdp_entry>& entries, const hsdp_spaces& spaces,
                            const std::vector<std::size_t>& members, bool gather, int& next_tag,
                            bool release_buffers) {
    std::map<std::pair<std::type_index, int>, std::vector<std::size_t>> by_type;
    for (std::size_t i : members)
        by_type[{entries[i].type, entries[i].space}].push_back(i);
    std::vector<hsdp_exchange> out;
    for (auto& [type, list] : by_type)
        out.push_back(plan_hsdp_exchange(entries, spaces, std::move(list), gather, next_tag++,
                                         release_buffers));
    return out;
}

XSHARD_DECL std::vector<hsdp_exchange> plan_hsdp_buckets(std::vector<hsdp_entry>& entries,
                                                         const hsdp_spaces& spaces,
                                                         std::size_t limit, bool gather,
                                                         bool release_buffers) {
    std::vector<std::size_t> all(entries.size());
    std::iota(all.begin(), all.end(), std::size_t(0));
    auto buckets = fill_buckets<std::pair<std::type_index, int>>(
        all, limit, [&](std::size_t i) { return entries[i].bytes; },
        [&](std::size_t i) {
            return std::pair{entries[i].type, entries[i].space};
        });
    std::vector<hsdp_exchange> out;
    for (auto& b : buckets) {
        hsdp_exchange f;
        if (b.members.size() > 1)
            f = plan_hsdp_exchange(entries, spaces, std::move(b.members), gather, hsdp_bucket_tag,
                                   release_buffers);
        else
            f.members = std::move(b.members);
        out.push_back(std::move(f));
    }
    return out;
}

} // namespace xshard::detail

