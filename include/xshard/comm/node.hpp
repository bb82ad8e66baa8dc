#pragma once
/// \file
/// Which ranks of a communicator share a node (and so can read each other's memory through
/// MPI-3 shared-memory windows), and whether xshard may use that.

#include <xshard/compiled.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <cstdlib>
#include <span>
#include <string_view>

namespace xshard {

/// Whether this process allows the node-local shared-memory transport: yes unless the
/// environment variable XSHARD_SHARED_MEMORY is "0", "off" or "no" (a switch for runs that
/// must take the MPI path, e.g. to compare the two). Local; see `node_group` for the agreed
/// decision.
XSHARD_DECL bool shared_memory_allowed() noexcept;

/// The members of a communicator that share this rank's node
/// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), and whether the whole communicator is
/// one node with the shared-memory transport allowed on every member.
class node_group {
public:
    node_group() = default;

    /// Splits `c` by node. Collective over `c`: one MPI_Comm_split_type and one all-reduce of
    /// an int (so that every member makes the same choice, whatever its environment says).
    explicit node_group(const communicator& c);

    /// The members of this rank's node (ranks ordered as in the split communicator).
    const communicator& comm() const noexcept { return node_; }
    /// Whether every member of the split communicator is on this node and allows the
    /// shared-memory transport (the same answer on every member).
    bool whole_communicator_shares_memory() const noexcept { return whole_; }

private:
    communicator node_;
    bool whole_ = false;
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/node.ipp>
#endif
