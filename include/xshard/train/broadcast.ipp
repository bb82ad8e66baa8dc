#pragma once
/// \file
/// The definitions of what train/broadcast.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/broadcast.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::vector<int> choose_owners(const std::vector<param_ref>& refs,
                                           broadcast_report& report) {
    std::vector<int> owner(refs.size(), -1);
    if (refs.empty())
        return owner;
    const auto& mesh = refs[0].mesh;
    report.bytes_owned.assign(std::size_t(mesh.size()), 0);
    std::vector<std::size_t> order(refs.size());
    std::iota(order.begin(), order.end(), 0);
    // Global sizes and names: the same order on every rank (local sizes differ).
    auto global = [&](std::size_t i) {
        return checked_mul(refs[i].element, volume(refs[i].shape), "a parameter's size");
    };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return global(a) != global(b) ? global(a) > global(b) : refs[a].name < refs[b].name;
    });
    for (std::size_t i : order) {
        const auto& r = refs[i];
        if (mesh.group_size(r.replicated) == 1)
            continue;
        // Every group of this parameter: the ranks with group rank 0 are the groups' firsts.
        for (int first = 0; first < mesh.size(); ++first) {
            if (mesh.group_rank(first, r.replicated) != 0)
                continue;
            const auto members = mesh.group_ranks(first, r.replicated);
            int best = members.front();
            for (int m : members)
                if (report.bytes_owned[std::size_t(m)] < report.bytes_owned[std::size_t(best)])
                    best = m;
            report.bytes_owned[std::size_t(best)] += r.block_bytes(first) * (members.size() - 1);
            if (std::find(members.begin(), members.end(), r.mesh_rank) != members.end())
                owner[i] = best;
        }
    }
    return owner;
}

} // namespace detail

} // namespace xshard

