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
inline void before_finalize(std::function<void()> hook) {
    auto& hooks = finalize_hooks();
    if (hooks.empty()) {
        int key = MPI_KEYVAL_INVALID;
        check_mpi(MPI_Comm_create_keyval(
                      MPI_COMM_NULL_COPY_FN,
                      [](MPI_Comm, int, void*, void*) -> int {
                          auto all = std::move(finalize_hooks());
                          finalize_hooks().clear();
                          for (auto it = all.rbegin(); it != all.rend(); ++it) {
                              try {
                                  (*it)();
                              } catch (...) {
                              }
                          }
                          return MPI_SUCCESS;
                      },
                      &key, nullptr),
                  "MPI_Comm_create_keyval");
        check_mpi(MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr), "MPI_Comm_set_attr");
    }
    hooks.push_back(std::move(hook));
}

} // namespace xshard::detail
