#pragma once
/// \file
/// An MPI-3 shared-memory window: memory every member of a one-node communicator can read
/// and write with plain loads and stores.

#include <xshard/compiled.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace xshard {

namespace detail {

/// Whether this process may make a file of `bytes` in shared memory, with a MiB to spare: its
/// file-size limit allows it and /dev/shm, where MPI makes shared windows, has the room.
XSHARD_DECL bool may_make_shared_file(std::size_t bytes);

} // namespace detail

/// `bytes` of memory per member of a communicator whose members share one node
/// (MPI_Win_allocate_shared), with every member's segment mapped into this process
/// (MPI_Win_shared_query). Move-only; freed (MPI_Win_free, collective) on destruction.
/// Holds a passive-target epoch on every member (MPI_Win_lock_all) from creation to
/// destruction, so that access is by plain loads and stores; ordering between members is
/// the caller's, by `sync()` and a barrier (see node_barrier.hpp).
class shared_window {
public:
    shared_window() = default;

    /// Allocates `bytes` (may differ per member, may be 0) on every member of `c`.
    /// Collective. Throws error on every member when `c` spans several nodes or some member
    /// could not make the window's file (see below), mpi_error when MPI refuses.
    ///
    /// MPI makes the window a file in shared memory (Open MPI: one file of every member's
    /// bytes, made by one member). Where that cannot succeed (a file-size limit, a full
    /// /dev/shm) it fails on that member and leaves the others waiting in the allocation for
    /// ever: so first every member checks that it could make the whole file, and all agree
    /// (a split by node and two all-reduces).
    shared_window(const communicator& c, std::size_t bytes);

    shared_window(shared_window&& o) noexcept;
    shared_window& operator=(shared_window&& o) noexcept {
        if (this != &o) {
            release();
            win_ = std::exchange(o.win_, MPI_WIN_NULL);
            bases_ = std::move(o.bases_);
            sizes_ = std::move(o.sizes_);
            rank_ = o.rank_;
        }
        return *this;
    }
    ~shared_window() { release(); }

    /// Whether a window was allocated.
    explicit operator bool() const noexcept { return win_ != MPI_WIN_NULL; }

    /// This member's segment.
    std::byte* local() const noexcept {
        return bases_.empty() ? nullptr : bases_[std::size_t(rank_)];
    }
    /// Member q's segment, as mapped into this process.
    std::byte* segment(int q) const noexcept { return bases_[std::size_t(q)]; }
    /// The bytes of member q's segment.
    std::size_t segment_bytes(int q) const noexcept { return sizes_[std::size_t(q)]; }
    /// The members.
    int size() const noexcept { return int(bases_.size()); }
    /// This member's rank among them.
    int rank() const noexcept { return rank_; }

    /// Makes this process's stores to the window visible and others' visible to it
    /// (MPI_Win_sync, a memory barrier): call before and after the barrier that orders
    /// writers and readers.
    void sync() const { detail::check_mpi(MPI_Win_sync(win_), "MPI_Win_sync"); }

    MPI_Win native() const noexcept { return win_; }

private:
    void release() noexcept {
        if (win_ == MPI_WIN_NULL)
            return;
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) {
            MPI_Win_unlock_all(win_);
            MPI_Win_free(&win_);
        }
        win_ = MPI_WIN_NULL;
    }

    MPI_Win win_ = MPI_WIN_NULL;
    std::vector<std::byte*> bases_;
    std::vector<std::size_t> sizes_;
    int rank_ = 0;
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/shared_window.ipp>
#endif
