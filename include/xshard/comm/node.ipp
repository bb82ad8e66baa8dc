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

namespace xshard {

XSHARD_DECL node_group::node_group(const communicator& c) {
    MPI_Comm out = MPI_COMM_NULL;
    detail::check_mpi(
        MPI_Comm_split_type(c.native(), MPI_COMM_TYPE_SHARED, c.rank(), MPI_INFO_NULL, &out),
        "MPI_Comm_split_type");
    node_ = communicator::adopt(out);
    int ok = node_.size() == c.size() && shared_memory_allowed() ? 1 : 0;
    allreduce(c, std::span(&ok, 1), reduction::min);
    whole_ = ok == 1;
}

} // namespace xshard
