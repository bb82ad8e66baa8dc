#pragma once
/// \file
/// The MPI environment: RAII over MPI_Init_thread / MPI_Finalize.

#include <xshard/compiled.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/heap.hpp>
#include <xshard/comm/watch.hpp>

#include <mpi.h>

#include <cstdlib>

namespace xshard {

/// The thread support a program asks MPI for (MPI_THREAD_*).
enum class thread_level : int {
    single = MPI_THREAD_SINGLE,
    funneled = MPI_THREAD_FUNNELED,
    serialized = MPI_THREAD_SERIALIZED,
    multiple = MPI_THREAD_MULTIPLE,
};

/// Owns the MPI runtime for the lifetime of the object. Construct one at the top of
/// `main`; xshard itself never initialises MPI. If MPI is already initialised (by the
/// application or another library) the environment attaches to it and leaves
/// finalisation to its owner. A program started without `mpirun` runs as one rank
/// (MPI singleton mode).
///
/// Construction also opens the communicator of failure notices that watched waits listen
/// to (comm/watch.hpp; collective over MPI_COMM_WORLD): construct it on every rank.
///
/// It also has the heap keep freed blocks for reuse (`keep_freed_memory`, comm/heap.hpp),
/// so that a training step's activations do not fault their pages in again every step; set
/// `XSHARD_KEEP_FREED_MEMORY=0` to leave glibc's defaults. Launched with
/// `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, that heap is on transparent huge pages.
///
/// When it initialises Open MPI it leaves out the AVX reduction component, which sums
/// unsigned 8- and 16-bit integers with saturation in Open MPI 4.1 (set OMPI_MCA_op to
/// choose the components yourself).
class environment {
public:
    explicit environment(thread_level required = thread_level::funneled);

    environment(int& argc, char**& argv, thread_level required = thread_level::funneled);

    environment(const environment&) = delete;
    environment& operator=(const environment&) = delete;

    ~environment() {
        if (owns_ && !finalized())
            MPI_Finalize();
    }

    /// Whether MPI_Init has been called (by anyone).
    static bool initialized() noexcept {
        int flag = 0;
        MPI_Initialized(&flag);
        return flag != 0;
    }

    /// Whether MPI_Finalize has been called.
    static bool finalized() noexcept {
        int flag = 0;
        MPI_Finalized(&flag);
        return flag != 0;
    }

    /// Whether this object initialised MPI (and so will finalise it).
    bool owns_mpi() const noexcept { return owns_; }

    /// The thread support MPI provides.
    thread_level provided() const noexcept { return provided_; }

    /// MPI_COMM_WORLD, borrowed.
    communicator world() const { return communicator::world(); }

    /// This process's rank in MPI_COMM_WORLD (MindSpore's global rank), -1 when MPI is not
    /// running: for naming the process (files, log lines), not for communicating.
    static int world_rank() noexcept { return detail::world_rank(); }

    /// The number of processes in MPI_COMM_WORLD (MindSpore's rank size), 0 when MPI is not
    /// running.
    static int world_size() noexcept {
        if (!initialized() || finalized())
            return 0;
        int size = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        return size;
    }

private:
    environment(int* argc, char*** argv, thread_level required);

    // Open MPI 4.1's AVX reduction component saturates MPI_SUM on unsigned 8- and 16-bit
    // integers instead of wrapping (255 + 255 gives 255). Unless the user chose the
    // reduction components (OMPI_MCA_op, or mpirun --mca op ...), leave it out.
    static void avoid_saturating_sums() {
#ifdef OPEN_MPI
        ::setenv("OMPI_MCA_op", "^avx", 0);
#endif
    }

    bool owns_ = false;
    thread_level provided_ = thread_level::single;
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/environment.ipp>
#endif
