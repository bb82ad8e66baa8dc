#pragma once
/// \file
/// Fusion buckets: items that travel in one collective, filled in order up to a byte limit.
/// Gradient synchronisation and parameter broadcast fill them with parameters
/// (train/fusion.hpp), optimizer sharding with its sharded weights' all-gathers and
/// reduce-scatters (train/hsdp_exchange.hpp).

#include <concepts>
#include <cstddef>
#include <map>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard::detail {

/// A bucket: items (indices into the caller's records) that travel in one collective, in
/// order.
struct bucket {
    std::vector<std::size_t> members;
    std::size_t bytes = 0;
    int root = 0; ///< broadcast: the owner's rank in the group
};

/// Groups the items `chosen` into buckets: one list per key (items of different keys never
/// share a bucket), each bucket closed when adding an item of `bytes_of(i)` bytes would pass
/// `limit` bytes (0: one item per bucket). The buckets come out key by key in the order of
/// the keys, each key's members in the order of `chosen`: the same on every rank that
/// computes it from the same items.
template <class Key, class BytesOf, class KeyOf>
requires std::convertible_to<std::invoke_result_t<BytesOf&, std::size_t>, std::size_t> &&
    std::convertible_to<std::invoke_result_t<KeyOf&, std::size_t>, Key>
        std::vector<bucket> fill_buckets(const std::vector<std::size_t>& chosen, std::size_t limit,
                                         BytesOf bytes_of, KeyOf key_of) {
    std::map<Key, std::vector<bucket>> by_key;
    for (std::size_t i : chosen) {
        auto& list = by_key[key_of(i)];
        const std::size_t bytes = bytes_of(i);
        if (list.empty() || limit == 0 || list.back().bytes + bytes > limit)
            list.emplace_back();
        list.back().members.push_back(i);
        list.back().bytes += bytes;
    }
    std::vector<bucket> out;
    for (auto& [key, list] : by_key)
        for (auto& b : list)
            out.push_back(std::move(b));
    return out;
}

} // namespace xshard::detail
