#pragma once
/// \file
/// The definitions of what comm/environment.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/environment.hpp>

namespace xshard {

XSHARD_DECL environment::environment(thread_level required)
    : environment(nullptr, nullptr, required) {}

XSHARD_DECL environment::environment(int &argc, char **&argv,
                                     thread_level required)
    : environment(&argc, &argv, required) {}

XSHARD_DECL environment::environment(int* argc, char*** argv, thread_level required) {
    if (finalized())
        throw error("xshard: cannot create an environment after MPI_Finalize");
    keep_freed_memory();
    if (initialized()) {
        int level = 0;
        MPI_Query_thread(&level);
        provided_ = static_cast<thread_level>(level);
        detail::open_watch();
        return;
    }
    avoid_saturating_sums();
    int level = 0;
    detail::check_mpi(MPI_Init_thread(argc, argv, static_cast<int>(required), &level),
                      "MPI_Init_thread");
    provided_ = static_cast<thread_level>(level);
    owns_ = true;
    detail::open_watch();
}

} // namespace xshard
