#pragma once
/// \file
/// The definitions of what comm/request.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/request.hpp>

namespace xshard {

XSHARD_DECL void wait_all(std::span<request> requests) {
    std::vector<MPI_Request> handles;
    handles.reserve(requests.size());
    for (auto& r : requests)
        handles.push_back(*r.native());
    struct put_back { // the handles go back whether the wait returns or raises
        std::span<request> to;
        std::vector<MPI_Request>& from;
        ~put_back() {
            for (std::size_t i = 0; i < to.size(); ++i)
                *to[i].native() = from[i];
        }
    } back{requests, handles};
    detail::watched_wait(handles, "MPI_Waitall");
}

} // namespace xshard

