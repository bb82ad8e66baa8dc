#pragma once
/// \file
/// The definitions of what comm/before_finalize.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/before_finalize.hpp>

namespace xshard::detail {

XSHARD_DECL void before_finalize(std::function<void()> hook) {
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

