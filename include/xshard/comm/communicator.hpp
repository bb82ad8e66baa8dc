#pragma once
/// \file
/// An MPI communicator handle: owning (freed with the last copy) or borrowed.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>

#include <mpi.h>

#include <memory>
#include <set>

namespace xshard {
namespace detail {

/// The attribute that marks a communicator broken (made once per process; see `broken`).
XSHARD_DECL int broken_key();

/// Marks `comm` broken: a collective on it was given up (see comm/watch.hpp).
inline void mark_broken(MPI_Comm comm) {
    if (comm != MPI_COMM_NULL)
        check_mpi(MPI_Comm_set_attr(comm, broken_key(), nullptr), "MPI_Comm_set_attr");
}

/// The communicators xshard owns that are alive (made by dup, split or MPI_Cart_sub, or
/// adopted), in no particular order.
inline std::set<MPI_Comm>& owned_communicators() {
    static std::set<MPI_Comm> all;
    return all;
}

/// Marks every communicator xshard owns broken: what every rank of a failure scope does when
/// some rank gave up a wait, since a rank cannot know on which communicators the others did.
inline void mark_owned_broken() {
    for (const MPI_Comm comm : owned_communicators())
        mark_broken(comm);
}

/// Whether `comm` is marked broken.
XSHARD_DECL bool is_broken(MPI_Comm comm);

} // namespace detail

namespace mpi {

/// A communicator. Copies share the handle; an owning communicator (one xshard made by
/// dup, split or MPI_Cart_sub, or one adopted with `communicator::adopt`) is freed when
/// the last copy goes, unless MPI is already finalised or the communicator is `broken()`.
/// Communicators xshard creates report errors as exceptions (MPI_ERRORS_RETURN + mpi_error) instead
/// of aborting.
class communicator {
public:
    /// The null communicator (what `split` gives a rank that passes `undefined`).
    communicator() = default;

    /// Borrows `comm`: xshard never frees it and leaves its error handler as it is.
    static communicator borrow(MPI_Comm comm) { return communicator(comm, false); }

    /// Takes ownership of `comm`: it is freed with the last copy and returns errors.
    static communicator adopt(MPI_Comm comm) { return communicator(comm, true); }

    /// MPI_COMM_WORLD, borrowed.
    static communicator world() { return borrow(MPI_COMM_WORLD); }

    /// MPI_COMM_SELF, borrowed.
    static communicator self() { return borrow(MPI_COMM_SELF); }

    /// Colour meaning "this rank joins no group" in `split`.
    static constexpr int undefined = MPI_UNDEFINED;

    bool is_null() const noexcept { return comm_ == MPI_COMM_NULL; }
    explicit operator bool() const noexcept { return !is_null(); }

    /// The rank of this process in the communicator.
    int rank() const noexcept { return rank_; }
    /// The number of processes in the communicator.
    int size() const noexcept { return size_; }

    /// Whether a collective on this communicator was given up after a peer's failure (on
    /// this rank, or on another rank of a failure scope over it; see comm/watch.hpp): some
    /// rank may still have it posted, so using the communicator again raises at once. A
    /// program that goes on after a `peer_failure` builds a new mesh (or resumes from a
    /// checkpoint).
    bool broken() const { return !is_null() && detail::is_broken(comm_); }

    /// The underlying MPI handle, for calling MPI directly.
    MPI_Comm native() const noexcept { return comm_; }

    /// A new communicator with the same group (MPI_Comm_dup); collective.
    communicator dup() const {
        MPI_Comm out = MPI_COMM_NULL;
        detail::check_mpi(MPI_Comm_dup(comm_, &out), "MPI_Comm_dup");
        return adopt(out);
    }

    /// Splits into groups by `color`, ordered by `key` then by rank (MPI_Comm_split);
    /// collective. A rank passing `undefined` gets the null communicator.
    communicator split(int color, int key = 0) const {
        MPI_Comm out = MPI_COMM_NULL;
        detail::check_mpi(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
        return out == MPI_COMM_NULL ? communicator() : adopt(out);
    }

    /// Whether two handles name the same communicator object.
    friend bool operator==(const communicator& a, const communicator& b) noexcept {
        return a.comm_ == b.comm_;
    }

private:
    struct freer {
        void operator()(MPI_Comm* comm) const noexcept {
            int finalized = 0;
            MPI_Finalized(&finalized);
            // A broken communicator stays: freeing it would let MPI reuse its context for a
            // new communicator, whose messages the abandoned operations could then match.
            detail::owned_communicators().erase(*comm);
            if (!finalized && *comm != MPI_COMM_NULL && !detail::is_broken(*comm))
                MPI_Comm_free(comm);
            delete comm;
        }
    };

    communicator(MPI_Comm comm, bool owned);

    MPI_Comm comm_ = MPI_COMM_NULL;
    std::shared_ptr<MPI_Comm> owner_;
    int rank_ = 0;
    int size_ = 0;
};

} // namespace mpi

/// `mpi::communicator` under its everyday name.
using mpi::communicator;

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/comm/communicator.ipp>
#endif
