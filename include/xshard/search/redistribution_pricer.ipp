#pragma once
/// \file
/// The definitions of what search/redistribution_pricer.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/redistribution_pricer.hpp>

namespace xshard {

XSHARD_DECL std::vector<layout> redistribution_pricer::route(const layout& from, const layout& to,
                                                             std::size_t rows,
                                                             std::size_t features) const {
    std::vector<layout> r{from};
    for (const auto& s : planned(from, to, std::array<std::size_t, 2>{rows, features}))
        r.push_back(s.to);
    return r;
}

XSHARD_DECL std::vector<int> redistribution_pricer::sample_ranks() const {
    if (mesh_.size() > 64)
        return detail::corner_ranks(mesh_);
    std::vector<int> ranks;
    for (int r = 0; r < mesh_.size(); ++r)
        ranks.push_back(r);
    return ranks;
}

} // namespace xshard
