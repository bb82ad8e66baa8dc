#pragma once
/// \file
/// The definitions of what comm/watch.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/comm/watch.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL watch_settings settings_from_environment() {
    watch_settings s;
    if (const char* t = std::getenv("XSHARD_COLLECTIVE_TIMEOUT"); t && *t)
        s.timeout = std::chrono::duration<double>(std::strtod(t, nullptr));
    if (const char* a = std::getenv("XSHARD_ON_TIMEOUT"); a && std::string_view(a) == "abort")
        s.action = on_timeout::abort;
    return s;
}

XSHARD_DECL void open_watch() {
    auto& w = watch();
    if (w.notices != MPI_COMM_NULL)
        return;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &w.notices), "MPI_Comm_dup");
    check_mpi(MPI_Comm_set_errhandler(w.notices, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    before_finalize([] {
        auto& s = watch();
        if (s.notices != MPI_COMM_NULL)
            MPI_Comm_free(&s.notices);
        s.notices = MPI_COMM_NULL;
    });
}

XSHARD_DECL std::vector<int> world_ranks(MPI_Comm comm) {
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    check_mpi(MPI_Comm_group(comm, &group), "MPI_Comm_group");
    check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
    int n = 0;
    MPI_Group_size(group, &n);
    std::vector<int> mine(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
        mine[std::size_t(i)] = i;
    const int code = MPI_Group_translate_ranks(group, n, mine.data(), world, out.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    check_mpi(code, "MPI_Group_translate_ranks");
    return out;
}

XSHARD_DECL std::string rank_list(const std::vector<int>& ranks) {
    std::string s;
    for (std::size_t i = 0; i < ranks.size();) {
        std::size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
            ++j;
        s += (s.empty() ? "" : ",") + std::to_string(ranks[i]);
        if (j > i)
            s += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
        i = j + 1;
    }
    return s;
}

XSHARD_DECL void announce_failure(MPI_Comm comm, const std::string& message) {
    auto& w = watch();
    if (w.notices == MPI_COMM_NULL || comm == MPI_COMM_NULL)
        return;
    int me = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const std::string& text = w.sent.emplace_back(message);
    for (const int r : world_ranks(comm)) {
        if (r == me)
            continue;
        MPI_Request q = MPI_REQUEST_NULL;
        check_mpi(MPI_Isend(text.data(), int(std::min<std::size_t>(text.size(), 1 << 20)), MPI_CHAR,
                            r, notice_tag, w.notices, &q),
                  "MPI_Isend");
        check_mpi(MPI_Request_free(&q), "MPI_Request_free");
    }
}

XSHARD_DECL std::string receive_notice(const MPI_Status& status) {
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    std::string text(std::size_t(length), '\0');
    check_mpi(MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, status.MPI_TAG,
                       watch().notices, MPI_STATUS_IGNORE),
              "MPI_Recv");
    return text;
}

XSHARD_DECL void settle_notice(int from) {
    auto& w = watch();
    if (w.notices == MPI_COMM_NULL)
        return;
    if (auto it = w.credits.find(from); it != w.credits.end() && it->second > 0) {
        --it->second;
        return;
    }
    MPI_Status status;
    check_mpi(MPI_Probe(from, notice_tag, w.notices, &status), "MPI_Probe");
    receive_notice(status);
}

XSHARD_DECL void forget_settled_failure() {
    auto& w = watch();
    for (const auto& [rank, count] : w.credits)
        if (count > 0)
            return;
    w.failure.reset();
}

XSHARD_DECL std::string flight_recorder_text() {
    const auto& w = watch();
    int me = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    std::string out = "xshard flight recorder, rank " + std::to_string(me) + ", last " +
                      std::to_string(std::min<std::uint64_t>(w.next, recorder_size)) + " waits:\n";
    const std::uint64_t first = w.next > recorder_size ? w.next - recorder_size : 0;
    for (std::uint64_t i = first; i < w.next; ++i) {
        const auto& e = w.ring[i % recorder_size];
        char line[256];
        static constexpr const char* states[] = {"waiting", "done", "abandoned"};
        std::snprintf(
            line, sizeof line, "  #%llu %.*s, %zu bytes, %d ranks (comm %#llx): %s after %.6f s\n",
            static_cast<unsigned long long>(e.sequence), int(e.operation.size()),
            e.operation.data(), e.bytes, e.members, static_cast<unsigned long long>(e.communicator),
            states[int(e.status)], e.seconds);
        out += line;
    }
    return out;
}

XSHARD_DECL void watched_wait(std::span<MPI_Request> requests, std::string_view operation,
                              MPI_Comm comm, int members, std::size_t bytes,
                              wait_kind kind) {
    if (requests.empty())
        return;
    wait_watch w(operation, comm, members, bytes, kind.heed_notices, kind.point_to_point);
    for (unsigned spin = 0;; ++spin) {
        int done = 0;
        check_mpi(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
                  operation);
        if (done) {
            w.done();
            return;
        }
        w.check(requests, spin);
    }
}

XSHARD_DECL bool finish_quietly(std::span<MPI_Request> requests) noexcept {
    auto& w = watch();
    const auto abandoned = w.abandoned;
    const auto start = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> heard;
    for (unsigned spin = 0;; ++spin) {
        int done = 0;
        if (MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE) !=
            MPI_SUCCESS)
            return false;
        if (done)
            return true;
        const auto now = std::chrono::steady_clock::now();
        int notice = 0;
        if (w.notices != MPI_COMM_NULL)
            MPI_Iprobe(MPI_ANY_SOURCE, notice_tag, w.notices, &notice, MPI_STATUS_IGNORE);
        if ((notice || w.failure) && !heard)
            heard = now;
        const bool late = w.settings.timeout.count() > 0 && now - start > w.settings.timeout;
        if (late || w.abandoned != abandoned || (heard && now - *heard > w.settings.notice_grace)) {
            for (auto& q : requests)
                q = MPI_REQUEST_NULL;
            ++w.abandoned;
            return false;
        }
        if (spin > 1000)
            std::this_thread::yield();
    }
}

XSHARD_DECL void require_whole(const communicator& c, std::string_view operation) {
    if (c.broken())
        throw error("xshard: " + std::string(operation) +
                    " on a communicator that abandoned a collective after a peer's failure: "
                    "build a new mesh, or resume from a checkpoint");
}

} // namespace detail

XSHARD_DECL std::vector<flight_entry> flight_recorder() {
    const auto& w = detail::watch();
    std::vector<flight_entry> out;
    const std::uint64_t first = w.next > detail::recorder_size ? w.next - detail::recorder_size : 0;
    for (std::uint64_t i = first; i < w.next; ++i)
        out.push_back(w.ring[i % detail::recorder_size]);
    return out;
}

} // namespace xshard

namespace xshard {

namespace detail {

XSHARD_DECL void wait_watch::check(std::span<MPI_Request> requests, unsigned spin) {
    if (state_.notices != MPI_COMM_NULL) {
        int found = 0;
        MPI_Status status;
        check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, heed_ ? MPI_ANY_TAG : query_tag, state_.notices,
                             &found, &status),
                  "MPI_Iprobe");
        if (found)
            handle(status);
    }
    if (heed_ && state_.failure && (spin & 63) == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (!heard_)
            heard_ = now;
        if (now - *heard_ > std::min(state_.settings.notice_grace, timeout()))
            peer_failed(requests);
    }
    if ((spin & 63) == 0 && comm_ != MPI_COMM_NULL && is_broken(comm_)) {
        abandon(requests); // posted before a failure scope broke the communicator
        throw error("xshard: " + std::string(state_.ring[entry_ % recorder_size].operation) +
                    " on a communicator broken after a peer's failure");
    }
    if ((spin & 63) == 0 && state_.settings.timeout.count() > 0 &&
        std::chrono::steady_clock::now() - start_ > state_.settings.timeout)
        timed_out(requests);
    if (spin > 1000)
        std::this_thread::yield();
}

XSHARD_DECL void wait_watch::handle(const MPI_Status& status) {
    const std::string text = receive_notice(status);
    if (status.MPI_TAG == query_tag) {
        MPI_Request q = MPI_REQUEST_NULL;
        static const char yes = 1;
        check_mpi(
            MPI_Isend(&yes, 1, MPI_CHAR, status.MPI_SOURCE, answer_tag, state_.notices, &q),
            "MPI_Isend");
        check_mpi(MPI_Request_free(&q), "MPI_Request_free");
        return;
    }
    if (status.MPI_TAG != notice_tag)
        return;
    ++state_.credits[status.MPI_SOURCE];
    if (!state_.failure)
        state_.failure = watch_state::heard{status.MPI_SOURCE, text};
}

XSHARD_DECL std::vector<int> wait_watch::waiting_members(const std::vector<int>& members) {
    std::vector<int> out;
    if (state_.notices == MPI_COMM_NULL)
        return out;
    int me = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Status status;
    for (int found = 1; found;) { // answers to an earlier timeout's questions
        check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, answer_tag, state_.notices, &found, &status),
                  "MPI_Iprobe");
        if (found)
            receive_notice(status);
    }
    static const char ask = 0;
    for (const int r : members) {
        if (r == me)
            continue;
        MPI_Request q = MPI_REQUEST_NULL;
        check_mpi(MPI_Isend(&ask, 1, MPI_CHAR, r, query_tag, state_.notices, &q), "MPI_Isend");
        check_mpi(MPI_Request_free(&q), "MPI_Request_free");
    }
    const auto grace = std::min(std::chrono::duration<double>(1.0), state_.settings.timeout);
    const auto until = std::chrono::steady_clock::now() + grace;
    out.push_back(me);
    while (std::chrono::steady_clock::now() < until && out.size() < members.size()) {
        int found = 0;
        for (const int tag : {query_tag, answer_tag}) {
            check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, tag, state_.notices, &found, &status),
                      "MPI_Iprobe");
            if (!found)
                continue;
            if (tag == query_tag) {
                handle(status); // another waiting rank's question
            } else {
                receive_notice(status);
                out.push_back(status.MPI_SOURCE);
            }
        }
        std::this_thread::yield();
    }
    return out;
}

XSHARD_DECL void wait_watch::timed_out(std::span<MPI_Request> requests) {
    const auto& e = state_.ring[entry_ % recorder_size];
    const std::vector<int> members =
        comm_ == MPI_COMM_NULL ? std::vector<int>{} : world_ranks(comm_);
    std::vector<int> waiting = waiting_members(members), missing;
    for (const int r : members)
        if (std::find(waiting.begin(), waiting.end(), r) == waiting.end())
            missing.push_back(r);
    abandon(requests);
    const std::string message =
        "xshard: " + std::string(e.operation) + " (" + std::to_string(e.bytes) +
        " bytes) has not completed after " + std::to_string(state_.settings.timeout.count()) +
        " s on rank " + std::to_string(world_rank()) +
        "; its communicator's ranks (in MPI_COMM_WORLD): " +
        (members.empty() ? "unknown" : rank_list(members)) +
        "; not waiting in a collective: " + (missing.empty() ? "none" : rank_list(missing));
    std::fprintf(stderr, "%s\n%s", message.c_str(), flight_recorder_text().c_str());
    std::fflush(stderr);
    if (state_.settings.action == on_timeout::abort)
        MPI_Abort(MPI_COMM_WORLD, 1);
    throw collective_timeout(message);
}

} // namespace detail
} // namespace xshard
