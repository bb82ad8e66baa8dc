#pragma once
/// \file
/// The fused exchanges of optimizer sharding (train/hsdp.hpp): the all-gathers (or the
/// reduce-scatters) of several sharded weights of one element type, travelling as one
/// batched exchange (redistribute/batch.hpp), planned once. Two groupings use them: the
/// fusion buckets of a blocking step (MindSpore's comm_fusion `allgather` and
/// `reducescatter`) and the per-layer exchanges that hsdp::forward and hsdp::backward start
/// and finish around each layer (train/hsdp_units.hpp).

#include <xshard/compiled.hpp>
#include <xshard/redistribute/batch.hpp>
#include <xshard/train/buckets.hpp>
#include <xshard/train/hsdp_entry.hpp>
#include <xshard/train/hsdp_spaces.hpp>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <typeindex>
#include <utility>
#include <vector>

namespace xshard::detail {

/// An exchange of sharded weights (indices into the entries) of one element type and one
/// space: `start` and `finish` its two halves, `run` both, `test` lets MPI move it. A bucket
/// of one weight has none (`run` empty): that weight's own planned collective runs.
struct hsdp_exchange {
    std::vector<std::size_t> members;
    std::function<void()> run, start, finish;
    std::function<bool()> test;
};

/// The message tag of the fusion buckets (the batch plan's default): they run one at a
/// time, blocking, so one tag serves them all.
inline constexpr int hsdp_bucket_tag = 7;

/// One exchange of the weights `members` of `entries` (of element type T and one space of
/// `spaces`) on message tag `tag` (exchanges in flight at once use distinct tags): their
/// all-gather (`gather`) or the reduce-scatter of their terms, which on a copy mesh ends
/// with the sum over the copies. With `release_buffers` (level3, which holds memory only
/// while in use) the staging buffers are freed after each exchange. `entries` must outlive
/// the exchange, its elements kept in place.
template <class T>
hsdp_exchange plan_hsdp_exchange_of(std::vector<hsdp_entry>& entries, const hsdp_spaces& spaces,
                                    std::vector<std::size_t> members, bool gather, int tag,
                                    bool release_buffers) {
    hsdp_exchange f;
    f.members = std::move(members);
    const int space = entries[f.members.front()].space;
    std::vector<hsdp_entry>* list = &entries;
    auto plan =
        std::make_shared<batch_redistribution_plan<T>>(spaces.comm(space), spaces.shape(space));
    for (std::size_t i : f.members)
        entries[i].add_to(plan.get(), gather);
    f.start = [list, plan, members = f.members, gather, tag] {
        std::vector<const T*> in;
        std::vector<T*> dst;
        for (std::size_t i : members) {
            in.push_back(static_cast<const T*>((*list)[i].source(gather)));
            dst.push_back(static_cast<T*>((*list)[i].destination(gather)));
        }
        plan->start(in, dst, tag);
    };
    f.finish = [list, plan, members = f.members, gather, release_buffers] {
        plan->finish();
        if (release_buffers)
            plan->release_buffers();
        if (!gather)
            for (std::size_t i : members)
                if ((*list)[i].across_reduce)
                    (*list)[i].across_reduce();
    };
    f.test = [plan] {
        return plan->test();
    };
    f.run = [start = f.start, finish = f.finish] {
        start();
        finish();
    };
    return f;
}

/// One exchange of the weights `members` of `entries`, of one element type (see
/// plan_hsdp_exchange_of, which each entry names for its own type).
inline hsdp_exchange plan_hsdp_exchange(std::vector<hsdp_entry>& entries, const hsdp_spaces& spaces,
                                        std::vector<std::size_t> members, bool gather, int tag,
                                        bool release_buffers) {
    const auto plan = entries[members.front()].plan_exchange;
    return plan(entries, spaces, std::move(members), gather, tag, release_buffers);
}

/// Per element type and space, one exchange of `members` (see plan_hsdp_exchange), on tags
/// `next_tag`, `next_tag + 1`, ... (`next_tag` left past the last one taken).
XSHARD_DECL std::vector<hsdp_exchange>
plan_hsdp_exchanges_by_type(std::vector<hsdp_entry>& entries, const hsdp_spaces& spaces,
                            const std::vector<std::size_t>& members, bool gather, int& next_tag,
                            bool release_buffers);

/// The entries in fusion buckets of at most `limit` bytes per element type and space
/// (train/buckets.hpp; 0: one weight per bucket), in order; a bucket of more than one weight
/// gets its exchange (see plan_hsdp_exchange), a bucket of one none.
XSHARD_DECL std::vector<hsdp_exchange> plan_hsdp_buckets(std::vector<hsdp_entry>& entries,
                                                         const hsdp_spaces& spaces,
                                                         std::size_t limit, bool gather,
                                                         bool release_buffers);

} // namespace xshard::detail

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/train/hsdp_exchange.ipp>
#else
namespace xshard {
#define XSHARD_DETAIL_HSDP_EXCHANGE(T)                                                             \
    XSHARD_INSTANTIATE detail::hsdp_exchange detail::plan_hsdp_exchange_of<T>(                     \
        std::vector<detail::hsdp_entry>&, const detail::hsdp_spaces&, std::vector<std::size_t>,    \
        bool, int, bool);
XSHARD_COMPILED_ELEMENTS(XSHARD_DETAIL_HSDP_EXCHANGE)
#undef XSHARD_DETAIL_HSDP_EXCHANGE
} // namespace xshard
#endif
