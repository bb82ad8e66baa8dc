#pragma once
/// \file
/// The definitions of what io/node_io.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/node_io.hpp>

namespace xshard::detail {

XSHARD_DECL node_file_io::node_file_io(const communicator& c) {
    if (c.size() < 2 || !node_group(c).whole_communicator_shares_memory())
        return;
    const auto bytes = c.rank() == 0 ? 2 * window_bytes + flag_bytes(c.size()) : 0;
    if (!made_on_every_rank(c, [&] {
            window_ = shared_window(c, bytes);
            barrier_ = node_barrier(c);
            if (c.rank() == 0)
                std::fill_n(&flag(0, 0, c.size()), 2 * c.size(), std::uint64_t(0));
        })) {
        barrier_ = node_barrier();
        window_ = shared_window();
        return;
    }
    barrier_.arrive_and_wait(); // the flags are cleared before anyone reads them
    members_ = c.size();
    rank_ = c.rank();
}

XSHARD_DECL node_file_io& node_file_io::of(const communicator& c) {
    auto& all = registry();
    const auto it =
        std::find_if(all.begin(), all.end(), [&](const auto& r) { return r.first == c; });
    if (it != all.end())
        return *it->second;
    if (all.empty())
        before_finalize([] {
            for (auto& [comm, io] : registry()) { // (collective frees, in order)
                io.reset();
                comm = communicator();
            }
            registry().clear();
        });
    all.emplace_back(c, std::make_unique<node_file_io>(c));
    return *all.back().second;
}

} // namespace xshard::detail
