#pragma once
/// \file
/// The definitions of what comm/error.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/error.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL int world_rank() noexcept {
    int initialized = 0;
    int finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return -1;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

} // namespace detail

} // namespace xshard

namespace xshard {

XSHARD_DECL peer_failure::peer_failure(int rank, std::string message)
    : error("xshard: rank " + std::to_string(rank) + " failed: " + message)
    , rank_(rank)
    , message_(std::move(message)) {}

} // namespace xshard
