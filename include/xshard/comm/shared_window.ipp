#pragma once
/// \file
/// The definitions of what comm/shared_window.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/shared_window.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL bool may_make_shared_file(std::size_t bytes) {
    const std::size_t need = bytes + (std::size_t(1) << 20);
    rlimit limit{};
    if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        limit.rlim_cur < need)
        return false;
    struct statvfs fs {};
    return ::statvfs("/dev/shm", &fs) != 0 || std::size_t(fs.f_bavail) * fs.f_frsize >= need;
}

} // namespace detail

} // namespace xshard

namespace xshard {

XSHARD_DECL shared_window::shared_window(const communicator& c, std::size_t bytes) {
    unsigned long long total = bytes;
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM,
                                    c.native()),
                      "MPI_Allreduce");
    // The members on this rank's node: a window over ranks of several nodes is refused by
    // MPI (Open MPI aborts the job), so every member raises instead.
    MPI_Comm node = MPI_COMM_NULL;
    detail::check_mpi(
        MPI_Comm_split_type(c.native(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
    int node_size = 0;
    const int sized = MPI_Comm_size(node, &node_size);
    const int freed = MPI_Comm_free(&node);
    detail::check_mpi(sized, "MPI_Comm_size");
    detail::check_mpi(freed, "MPI_Comm_free");
    // {the lowest rank that cannot make the file (c.size(): none), 1 when this rank's node
    // holds every member}, the minima over the members.
    int verdict[2] = {detail::may_make_shared_file(std::size_t(total)) ? c.size() : c.rank(),
                      node_size == c.size() ? 1 : 0};
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, verdict, 2, MPI_INT, MPI_MIN, c.native()),
                      "MPI_Allreduce");
    if (verdict[1] == 0)
        throw error("xshard: a shared-memory window needs ranks of one node; this communicator "
                    "of " + std::to_string(c.size()) + " ranks spans several nodes "
                    "(node_group(c).comm() is this rank's node)");
    const int refusing = verdict[0];
    if (refusing < c.size())
        throw error("xshard: a shared-memory window of " + std::to_string(total) +
                    " bytes cannot be made: the file-size limit of rank " +
                    std::to_string(refusing) + " or the free space in /dev/shm forbids it");
    MPI_Info info = MPI_INFO_NULL;
    // Segments page-aligned in their own pages: members write their own segment hard,
    // and false sharing across a segment boundary would slow both.
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void* base = nullptr;
    const int code =
        MPI_Win_allocate_shared(MPI_Aint(bytes), 1, info, c.native(), &base, &win_);
    MPI_Info_free(&info);
    detail::check_mpi(code, "MPI_Win_allocate_shared");
    MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN);
    bases_.resize(std::size_t(c.size()));
    sizes_.resize(std::size_t(c.size()));
    for (int q = 0; q < c.size(); ++q) {
        MPI_Aint size = 0;
        int unit = 0;
        void* p = nullptr;
        detail::check_mpi(MPI_Win_shared_query(win_, q, &size, &unit, &p),
                          "MPI_Win_shared_query");
        bases_[std::size_t(q)] = static_cast<std::byte*>(p);
        sizes_[std::size_t(q)] = std::size_t(size);
    }
    detail::check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "MPI_Win_lock_all");
    rank_ = c.rank();
}

XSHARD_DECL shared_window::shared_window(shared_window&& o) noexcept
    : win_(std::exchange(o.win_, MPI_WIN_NULL))
    , bases_(std::move(o.bases_))
    , sizes_(std::move(o.sizes_))
    , rank_(o.rank_) {}

} // namespace xshard
