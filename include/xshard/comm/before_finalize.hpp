#pragma once
/// \file
/// Work run at the start of MPI_Finalize, whoever calls it, while MPI still works: what a
/// library keeps for the life of the process and must free collectively (a shared-memory
/// window) is freed there in the order it was made, the same on every rank. Left to
/// MPI_Finalize, Open MPI frees the windows still alive in an order of its own, which can
/// differ between ranks that made and freed other windows meanwhile: a hang.
///
/// MPI deletes MPI_COMM_SELF's attributes first thing in MPI_Finalize; the hooks hang on one
/// such attribute.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <functional>
#include <utility>
#include <vector>

namespace xshard::detail {

/// The hooks registered so far, in order.
inline std::vector<std::function<void()>>& finalize_hooks() {
    static std::vector<std::function<void()>> hooks;
    return hooks;
}

/// Runs `hook` at the start of MPI_Finalize (hooks run in the reverse order of their
/// registration; one that throws is ignored: MPI is finalising). MPI must be initialised and
/// not finalised. Not thread-safe.
XSHARD_DECL void before_finalize(std::function<void()> hook);

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/before_finalize.ipp>
#endif
