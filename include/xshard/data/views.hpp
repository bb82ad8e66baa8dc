#pragma once
/// \file
/// range-v3 views for data parallelism, with MindSpore's dataset semantics:
///
///     data | shuffle(seed, epoch) | take_shard(num_shards, shard_id) | batch(32, true)
///
/// `shuffle` permutes the samples the same way on every rank (the permutation depends on
/// the seed and the epoch only); `take_shard` deals them out round-robin, sample i of the order
/// to shard i % num_shards, dropping the last samples so that every shard has the same
/// length; `batch` stacks consecutive samples into batch arrays. Every view is a sized
/// random-access range-v3 view and makes its samples on access; no communication.
///
/// The tail: MindSpore's distributed sampler pads the last shards by repeating samples
/// from the start (each shard gets ceil(n / num_shards)). xshard drops the tail instead
/// (each shard gets floor(n / num_shards)): no sample is seen twice in an epoch, and the
/// at most num_shards - 1 dropped samples change with the shuffle from epoch to epoch.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/data/dataset.hpp>
#include <xshard/data/random.hpp>

#include <range/v3/functional/bind_back.hpp>
#include <range/v3/view/all.hpp>
#include <range/v3/view/chunk.hpp>
#include <range/v3/view/drop.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/stride.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>
#include <range/v3/view/view.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace xshard::data {

/// The order of the samples of an epoch: a permutation of 0 .. n-1 by Fisher-Yates on
/// `seeded_engine(seed, epoch)` (random.hpp). The same on every rank and every platform.
XSHARD_DECL std::vector<index_type> permutation(std::size_t n, std::uint64_t seed,
                                                std::uint64_t epoch);

namespace detail {

/// Sample `order[i]` of `base` (a reference when `base` holds its samples).
template <class V>
struct pick {
    V base;
    std::shared_ptr<const std::vector<index_type>> order;

    decltype(auto) operator()(index_type i) const {
        return ranges::begin(base)[std::ptrdiff_t((*order)[i])];
    }
};

/// `base` in the order `order` (a permutation, or any list of its indices).
template <class V>
auto permuted(V base, std::shared_ptr<const std::vector<index_type>> order) {
    const auto n = checked_index(order->size(), "permuted");
    return ranges::views::iota(index_type{0}, n) |
           ranges::views::transform(pick<V>{std::move(base), std::move(order)});
}

} // namespace detail

/// `data | shuffle(seed, epoch)`: the samples in the order `permutation(size, seed, epoch)`.
/// Computing the permutation costs O(n) time and 4n bytes, once per view.
struct shuffle_fn {
    template <viewable_dataset R>
    auto operator()(R&& data, std::uint64_t seed, std::uint64_t epoch) const {
        auto base = ranges::views::all(std::forward<R>(data));
        auto order = std::make_shared<const std::vector<index_type>>(
            permutation(std::size_t(ranges::size(base)), seed, epoch));
        return detail::permuted(std::move(base), std::move(order));
    }
    auto operator()(std::uint64_t seed, std::uint64_t epoch) const {
        return ranges::make_view_closure(ranges::bind_back(*this, seed, epoch));
    }
};

/// Shuffles a dataset the same way on every rank (see shuffle_fn).
inline constexpr shuffle_fn shuffle{};

/// `data | take_shard(num_shards, shard_id)` (tf.data's `shard`; MindSpore's datasets take
/// the same num_shards and shard_id): samples shard_id, shard_id + num_shards, ... of
/// the first floor(n / num_shards) * num_shards (the tail is dropped; see the file
/// comment), so every shard has floor(n / num_shards) samples. Throws xshard::error unless
/// shard_id < num_shards.
struct take_shard_fn {
    template <viewable_dataset R>
    auto operator()(R&& data, std::size_t num_shards, std::size_t shard_id) const {
        if (num_shards == 0 || shard_id >= num_shards)
            throw error("xshard: take_shard: shard_id " + std::to_string(shard_id) +
                        " is not below num_shards " + std::to_string(num_shards));
        auto base = ranges::views::all(std::forward<R>(data));
        const auto kept = std::size_t(ranges::size(base)) / num_shards * num_shards;
        return std::move(base) | ranges::views::take(kept) | ranges::views::drop(shard_id) |
               ranges::views::stride(std::ptrdiff_t(num_shards));
    }
    auto operator()(std::size_t num_shards, std::size_t shard_id) const {
        return ranges::make_view_closure(ranges::bind_back(*this, num_shards, shard_id));
    }
};

/// Deals a dataset out to shards round-robin and takes one of them (see take_shard_fn).
inline constexpr take_shard_fn take_shard{};

/// `data | batch(batch_size, drop_remainder)`: consecutive runs of batch_size samples,
/// each stacked by `collate` into its batch type (`example_batch<T>`, or an
/// `xt::xtensor<V, 2>` of token windows). The last batch is shorter unless
/// `drop_remainder`, which leaves it out. Throws xshard::error if batch_size is 0.
struct batch_fn {
    template <viewable_dataset R>
    requires sample<ranges::range_value_t<R>>
    auto operator()(R&& data, std::size_t batch_size, bool drop_remainder = false) const {
        if (batch_size == 0)
            throw error("xshard: batch: the batch size is 0");
        auto base = ranges::views::all(std::forward<R>(data));
        const auto n = std::size_t(ranges::size(base));
        const auto kept = drop_remainder ? n / batch_size * batch_size : n;
        return std::move(base) | ranges::views::take(kept) |
               ranges::views::chunk(std::ptrdiff_t(batch_size)) |
               ranges::views::transform([](auto&& samples) { return collate(samples); });
    }
    auto operator()(std::size_t batch_size, bool drop_remainder = false) const {
        return ranges::make_view_closure(ranges::bind_back(*this, batch_size, drop_remainder));
    }
};

/// Stacks runs of samples into batches (see batch_fn).
inline constexpr batch_fn batch{};

} // namespace xshard::data

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/data/views.ipp>
#endif
