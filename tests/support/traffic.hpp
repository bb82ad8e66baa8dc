#pragma once
// What this process handed to MPI's point-to-point sends, counted at the MPI boundary (the
// profiling interface: traffic.cpp defines MPI_Isend and MPI_Send, which count and call
// PMPI_*), so that tests check the library's own byte figures against what really left.
// Link traffic.cpp into a test program to use it.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace xshard::testing::traffic {

/// Forgets what was counted so far.
void reset();

/// Bytes sent since the last reset, per destination rank of MPI_COMM_WORLD.
const std::vector<unsigned long long>& sent_to();

/// Bytes sent since the last reset, in total.
unsigned long long sent();

/// The sum over the members of `c` of their `sent` (bytes): what a group sent in all.
inline unsigned long long total(const communicator& c, unsigned long long sent) {
    allreduce(c, std::span(&sent, 1), reduction::sum);
    return sent;
}

} // namespace xshard::testing::traffic
