#pragma once
/// \file
/// What the redistributions run in a scope cost this rank: the planner's predicted seconds
/// (the alpha-beta cost model, cost_model.hpp) and the bytes handed to MPI, added up over
/// every plan executed on this thread while a meter lives (meters nest: each counts what
/// ran in its lifetime). How shard()'s sharding_propagation prices a candidate's
/// communication, including the redistributions the operations inside the call insert.

#include <cstddef>

namespace xshard {

class redistribution_meter {
public:
    redistribution_meter() noexcept
        : outer_(current()) {
        current() = this;
    }
    ~redistribution_meter() { current() = outer_; }
    redistribution_meter(const redistribution_meter&) = delete;
    redistribution_meter& operator=(const redistribution_meter&) = delete;

    /// Predicted seconds of the plans executed so far (this rank's part).
    double seconds() const noexcept { return seconds_; }
    /// Bytes those plans handed to MPI on this rank.
    std::size_t bytes_sent() const noexcept { return bytes_; }
    /// How many plans ran.
    std::size_t plans() const noexcept { return plans_; }

    /// Called by a plan after each execute: adds to every live meter of this thread.
    static void record(double seconds, std::size_t bytes) noexcept {
        for (auto* m = current(); m; m = m->outer_) {
            m->seconds_ += seconds;
            m->bytes_ += bytes;
            ++m->plans_;
        }
    }

private:
    static redistribution_meter*& current() noexcept {
        static thread_local redistribution_meter* live = nullptr;
        return live;
    }
    redistribution_meter* outer_;
    double seconds_ = 0;
    std::size_t bytes_ = 0;
    std::size_t plans_ = 0;
};

} // namespace xshard
