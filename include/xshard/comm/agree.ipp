#pragma once
/// \file
/// The definitions of what comm/agree.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/agree.hpp>

namespace xshard {

XSHARD_DECL int first_reporting_rank(const communicator& c, bool bad) {
    int first = bad ? c.rank() : c.size();
    allreduce(c, std::span(&first, 1), reduction::min);
    return first == c.size() ? -1 : first;
}

namespace detail {

XSHARD_DECL std::string message_from(const communicator& c, int first,
                                     const std::optional<std::string>& mine) {
    unsigned long long length = c.rank() == first ? mine->size() : 0;
    bcast(c, std::span(&length, 1), first);
    std::string text(static_cast<std::size_t>(length), '\0');
    if (c.rank() == first)
        text = *mine;
    bcast(c, std::span(text.data(), text.size()), first);
    return text;
}

XSHARD_DECL MPI_Comm agreement_comm(const communicator& c) {
    static const int key = [] {
        int k = MPI_KEYVAL_INVALID;
        check_mpi(MPI_Comm_create_keyval(
                      MPI_COMM_NULL_COPY_FN,
                      [](MPI_Comm, int, void* value, void*) -> int {
                          auto* twin = static_cast<MPI_Comm*>(value);
                          int finalized = 0;
                          MPI_Finalized(&finalized);
                          if (!finalized && !is_broken(*twin)) // (see communicator's freer)
                              MPI_Comm_free(twin);
                          delete twin;
                          return MPI_SUCCESS;
                      },
                      &k, nullptr),
                  "MPI_Comm_create_keyval");
        before_finalize([k] {
            void* twin = nullptr;
            int found = 0;
            if (MPI_Comm_get_attr(MPI_COMM_WORLD, k, &twin, &found) == MPI_SUCCESS && found)
                MPI_Comm_delete_attr(MPI_COMM_WORLD, k);
        });
        return k;
    }();
    void* value = nullptr;
    int found = 0;
    check_mpi(MPI_Comm_get_attr(c.native(), key, &value, &found), "MPI_Comm_get_attr");
    if (found)
        return *static_cast<MPI_Comm*>(value);
    auto twin = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
    check_mpi(MPI_Comm_dup(c.native(), twin.get()), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(*twin, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_set_attr(c.native(), key, twin.get()), "MPI_Comm_set_attr");
    return *twin.release();
}

XSHARD_DECL scope_agreement agree_on_scope(const communicator& c, char mine, int my_origin,
                                           const std::string& my_message) {
    const MPI_Comm twin = agreement_comm(c);
    // The buffers MPI writes into: left to MPI when a wait is given up (the watchdog).
    struct buffers {
        scope_agreement out;
        long long head[2] = {0, 0};
        char mine = 0;
    };
    auto b = std::make_unique<buffers>();
    const auto wait = [&](MPI_Request& q, std::string_view what, std::size_t bytes) {
        try {
            watched_wait(std::span(&q, 1), what, twin, c.size(), bytes, {false, false});
        } catch (...) {
            (void)b.release();
            throw;
        }
    };
    auto& out = b->out;
    out.outcomes.assign(std::size_t(c.size()), 0);
    b->mine = mine;
    MPI_Request q = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(&b->mine, 1, MPI_CHAR, out.outcomes.data(), 1, MPI_CHAR, twin, &q),
              "MPI_Iallgather");
    wait(q, "agreement", out.outcomes.size());
    int first = -1;
    for (const char bit : {char(scope_announced), char(scope_failed)})
        for (int r = 0; r < c.size() && first < 0; ++r)
            if (out.outcomes[std::size_t(r)] & bit)
                first = r;
    if (first < 0)
        return std::move(out);
    b->head[0] = my_origin;
    b->head[1] = (long long)my_message.size();
    check_mpi(MPI_Ibcast(b->head, 2, MPI_LONG_LONG, first, twin, &q), "MPI_Ibcast");
    wait(q, "agreement", sizeof b->head);
    out.origin = int(b->head[0]);
    out.message = c.rank() == first ? my_message : std::string(std::size_t(b->head[1]), '\0');
    check_mpi(MPI_Ibcast(out.message.data(), int(b->head[1]), MPI_CHAR, first, twin, &q),
              "MPI_Ibcast");
    wait(q, "agreement", out.message.size());
    return std::move(out);
}

XSHARD_DECL void open_scope(const communicator& c, std::string_view what) {
    require_whole(c, what);
    if (c.size() > 1)
        agreement_comm(c);
}

XSHARD_DECL void close_scope(const communicator& c, std::uint64_t abandoned, char outcome,
                             int origin, const std::string& message, std::exception_ptr failure,
                             scope_failure fail, const communicator& told) {
    if (c.size() == 1) {
        if (failure)
            std::rethrow_exception(failure);
        if (outcome)
            fail(origin, message, failure);
        return;
    }
    if (watch().abandoned != abandoned)
        outcome |= scope_abandoned;
    const auto agreement = agree_on_scope(c, outcome, origin, message);
    const auto& all = agreement.outcomes;
    if (std::any_of(all.begin(), all.end(), [](char o) { return o & scope_abandoned; })) {
        mark_broken(c.native());
        mark_owned_broken();
    }
    if (agreement.origin < 0)
        return;
    const auto members = world_ranks(c.native());
    const auto cell = told == c ? members : world_ranks(told.native());
    for (int r = 0; r < c.size(); ++r) {
        const int from = members[std::size_t(r)];
        if ((all[std::size_t(r)] & scope_announced) && r != c.rank() &&
            std::find(cell.begin(), cell.end(), from) != cell.end())
            settle_notice(from);
    }
    forget_settled_failure();
    fail(agreement.origin, agreement.message, failure);
}

XSHARD_DECL void run_scope(const communicator& c, void (*body)(void*), void* state,
                           scope_failure fail) {
    open_scope(c, "an agreed call");
    const auto abandoned = watch().abandoned;
    std::exception_ptr failure;
    char outcome = 0;
    int origin = world_rank();
    std::string message;
    try {
        body(state);
    } catch (const peer_failure& e) { // raised again below as every other rank raises
        outcome = scope_failed;
        origin = e.rank();
        message = e.message();
    } catch (const std::exception& e) {
        failure = std::current_exception();
        outcome = scope_failed | scope_announced;
        message = e.what();
    } catch (...) {
        failure = std::current_exception();
        outcome = scope_failed | scope_announced;
        message = "an exception not derived from std::exception";
    }
    if (outcome & scope_announced)
        announce_failure(c.native(), message);
    close_scope(c, abandoned, outcome, origin, message, failure, fail, c);
}

} // namespace detail

} // namespace xshard

