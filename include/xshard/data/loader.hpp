#pragma once
/// \file
/// The loader: a dataset's global batches, step by step, as distributed tensors on a mesh.
///
/// Two modes, MindSpore's dataset_strategy (core/mesh.hpp):
///
///  * `data_parallel`: the ranks with the same coordinate on the data axis (default "dp")
///    form one data-parallel group and read one shard: num_shards = the axis size,
///    shard_id = the rank's coordinate on it. A global batch of B samples gives each shard
///    B / num_shards of them, and the batch tensors are split over the data axis in their
///    first dimension: x "[dp, -]", y "[dp]" (replicated over the other axes).
///  * `full_batch`: every rank reads the whole global batch; the tensors are replicated
///    ("[-, -]", "[-]"), no rank holds less than the batch.
///
/// Or one layout per tensor of the batch (`loader_options::layouts`, MindSpore's
/// dataset_strategy as a tuple of strategies or layouts): x "[dp, mp]" and y "[dp]", say. The
/// axes splitting the first tensor's first dimension form the shards, as the data axis does
/// for `data_parallel`, and fix the global batch's row order; every tensor then holds its
/// block of that batch under its layout: other dimensions split, rows split over other axes
/// or replicated (each rank reading the rows it holds).
///
/// In both modes the global batch of step s holds samples s*B .. s*B + B - 1 of the epoch's
/// order (`permutation(n, seed, epoch)`, or 0 .. n-1 without shuffling), whatever the
/// number of shards: shard k takes those at positions k, k + num_shards, ... of the batch
/// (`shard` applied to each global batch; for full batches this is exactly
/// `data | shuffle(seed, epoch) | take_shard(num_shards, k) | batch(B / num_shards)`). So a
/// training run sees the same batches on 1 rank and on any number, and only the order of
/// rows inside a batch differs: shard k's rows come k-th in the data-parallel tensor. A
/// last, shorter batch (drop_remainder off) is dealt out the same way, which gives the
/// first shards one row more than the others: the block partition of core/partition.hpp.

#include <xshard/compiled.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/data/dataset.hpp>
#include <xshard/data/views.hpp>
#include <xshard/tensor/dtensor.hpp>

#include <range/v3/view/all.hpp>
#include <range/v3/view/drop.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/slice.hpp>
#include <range/v3/view/stride.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard::data {

/// How a loader reads a dataset.
struct loader_options {
    /// The global batch size: samples per step over all data-parallel groups together.
    std::size_t batch_size = 0;
    /// Seed of the per-epoch shuffle (`permutation(n, seed, epoch)`).
    std::uint64_t seed = 0;
    /// Shuffle every epoch; off: samples in dataset order.
    bool shuffle = true;
    /// Leave out the last global batch when it is shorter than batch_size.
    bool drop_remainder = true;
    /// Accept a batch size the number of shards does not divide: shard k then reads
    /// B / num_shards rows, plus one for the first B % num_shards shards (the block
    /// partition of core/partition.hpp, as for a last, shorter batch). Off by default, as
    /// in MindSpore, which requires the division to be exact.
    bool uneven_batches = false;
    /// data_parallel or full_batch; default: the mesh's `dataset()`, and data_parallel when
    /// the mesh has none (`unset`).
    std::optional<dataset_strategy> strategy{};
    /// One layout per tensor of a batch (x then y for examples, one for token windows),
    /// instead of `strategy`: splits of any dimension over any axes of the mesh, no pending
    /// sums (see the file comment). Empty: the strategy's layouts.
    std::vector<layout> layouts{};
    /// The data-parallel axis; default: the mesh's `data_axis()` when it has a dataset
    /// strategy, else "dp" when the mesh has such an axis, else its first axis.
    std::string data_axis{};
};

/// A batch of classification samples on a mesh: x (batch, features) and y (batch).
template <ordered T, mesh_type Mesh>
struct distributed_examples {
    dtensor<T, Mesh, dynamic_layout(2)> x;
    dtensor<std::int64_t, Mesh, dynamic_layout(1)> y;
};

namespace detail {

template <class B, class Mesh>
struct distributed_batch_of;
template <class T, class Mesh>
struct distributed_batch_of<example_batch<T>, Mesh> {
    using type = distributed_examples<T, Mesh>;
};
template <class V, class Mesh>
struct distributed_batch_of<xt::xtensor<V, 2>, Mesh> {
    using type = dtensor<V, Mesh, dynamic_layout(2)>;
};

/// The view a loader keeps of a dataset given as `R`: the view itself, or a ref_view of a
/// container (an lvalue the caller keeps alive, or an rvalue the loader takes over).
template <class R>
using stored_view_t = ranges::views::all_t<const std::remove_cvref_t<R>&>;

/// The tensors of a batch B and their ranks.
template <class B>
inline constexpr std::array<std::size_t, 2> batch_ranks{2, 1}; // example_batch: x, y
template <class V>
inline constexpr std::array<std::size_t, 1> batch_ranks<xt::xtensor<V, 2>>{2};

template <class T>
std::size_t batch_width(const example_batch<T>& b) {
    return b.x.shape()[1];
}
template <class V>
std::size_t batch_width(const xt::xtensor<V, 2>& b) {
    return b.shape()[1];
}

/// The identity order 0 .. n-1.
XSHARD_DECL std::vector<index_type> identity_order(std::size_t n);

} // namespace detail

/// The distributed batch a loader of samples S gives on mesh type Mesh:
/// `distributed_examples<T, Mesh>` for `example<T>`, a rank-2 dtensor for token windows.
template <sample S, mesh_type Mesh>
using distributed_batch_t = typename detail::distributed_batch_of<batch_t<S>, Mesh>::type;

/// Reads a dataset in global batches on a mesh (see the file comment for the two modes).
///
///     data::loader load(mesh, dataset, {.batch_size = 64, .seed = 1});
///     for (std::uint64_t e = 0; e < epochs; ++e)
///         for (auto&& [x, y] : load.epoch(e)) { ... }
///
/// The loader keeps a view of the dataset: an lvalue container must outlive it; an rvalue
/// one is moved into it. Copies share their state. Construction throws xshard::error on
/// every rank alike for a batch size of 0 or one the number of shards does not divide
/// (unless `uneven_batches`), an empty dataset, one smaller than a batch with
/// drop_remainder, an unknown data axis, and datasets whose sizes differ between ranks
/// (checked with one all-reduce of four integers: construction is collective).
template <mesh_type Mesh, viewable_dataset V>
class loader {
public:
    /// The dataset's samples.
    using sample_type = ranges::range_value_t<V>;
    /// What a step gives (see distributed_batch_t).
    using batch_type = distributed_batch_t<sample_type, Mesh>;

    /// A loader of `data` (a container or a view of samples) on `mesh`.
    template <class R>
    requires std::same_as<detail::stored_view_t<R>, V> loader(const Mesh& mesh, R&& data,
                                                              const loader_options& options)
        : state_(make_state(mesh, std::forward<R>(data), options)) {}

    /// Steps per epoch: n / B with drop_remainder, else ceil(n / B).
    std::size_t steps_per_epoch() const noexcept { return state_->steps; }
    /// Samples in the dataset.
    std::size_t size() const noexcept { return state_->samples; }
    /// The global batch size.
    std::size_t batch_size() const noexcept { return state_->options.batch_size; }
    /// Samples this rank reads in a full step: its block of B over the shards (B / num_shards
    /// when they divide it; data_parallel) or B.
    std::size_t local_batch_size() const noexcept {
        return block_extent(state_->options.batch_size, state_->num_shards, state_->shard_id);
    }
    /// The mode in use (`unset` with per-tensor layouts).
    dataset_strategy strategy() const noexcept { return state_->strategy; }
    /// Number of shards (the data axis size in data_parallel mode, 1 in full_batch; with
    /// layouts, the blocks of the first tensor's first dimension).
    std::size_t num_shards() const noexcept { return state_->num_shards; }
    /// This rank's shard (its data-axis coordinate in data_parallel mode, 0 in full_batch;
    /// with layouts, its block of the first tensor's first dimension).
    std::size_t shard_id() const noexcept { return state_->shard_id; }
    /// The layout of the batch's first tensor: "[dp, -]", "[-, -]" or the first of `layouts`.
    const layout& batch_layout() const noexcept { return state_->layouts[0]; }
    /// The layouts of the batch's tensors, in order (x then y for examples).
    const std::vector<layout>& layouts() const noexcept { return state_->layouts; }

    /// The batches of epoch `epoch`: a sized random-access view of `batch_type`, one per
    /// step, each made when it is read (a range-for reads each once). Reading a batch is
    /// collective over the mesh (from_local's shape check: an all-reduce and an all-gather
    /// of a few integers per tensor), so every rank reads the same steps in the same order.
    /// Computing the epoch's order costs O(n) time and 4n bytes, once per call.
    auto epoch(std::uint64_t epoch) const {
        auto ordered = detail::permuted(state_->data, order(epoch));
        return ranges::views::iota(index_type{0}, index_type(state_->steps)) |
               ranges::views::transform([s = state_, ordered = std::move(ordered)](
                                            index_type step) { return s->batch(ordered, step); });
    }

    /// The dataset indices of the samples this rank reads at `step` of `epoch`, in the order
    /// of its rows (no communication). Throws xshard::error if there is no such step.
    std::vector<index_type> sample_indices(std::uint64_t epoch, std::size_t step) const {
        if (step >= state_->steps)
            throw error("xshard: loader: step " + std::to_string(step) + " of an epoch of " +
                        std::to_string(state_->steps));
        const auto o = order(epoch);
        const auto part = state_->local_part(ranges::views::all(*o), step);
        return std::vector<index_type>(ranges::begin(part), ranges::end(part));
    }

private:
    struct state {
        state(const Mesh& m, V d, const loader_options& o)
            : mesh(m)
            , options(o)
            , data(std::move(d)) {}

        Mesh mesh;
        loader_options options;
        V data;
        std::shared_ptr<const void> owner; // an rvalue container given to the loader
        dataset_strategy strategy = dataset_strategy::data_parallel;
        std::size_t num_shards = 1, shard_id = 0, samples = 0, steps = 0, width = 0;
        std::vector<layout> layouts; // one per tensor of a batch
        bool plain = true;           // every tensor's rows are this rank's shard, no other split

        static constexpr auto ranks = detail::batch_ranks<batch_t<sample_type>>;

        void check() {
            samples = std::size_t(ranges::size(data));
            // Before anything that only this rank's data decides can throw: every rank must
            // count the same steps, or they would call different collectives.
            width = samples > 0 ? detail::batch_width(collate(data | ranges::views::take(1))) : 0;
            detail::check_dataset_agrees(mesh.comm(), samples, width, "loader");
            detail::checked_index(samples, "loader");
            std::string axis;
            if (!options.layouts.empty()) {
                strategy = dataset_strategy::unset;
                check_layouts();
                layouts = options.layouts;
                axis = layouts[0].to_string() + "'s first dimension";
            } else {
                strategy = options.strategy.value_or(mesh.dataset());
                if (strategy == dataset_strategy::unset)
                    strategy = dataset_strategy::data_parallel;
                const std::string data = data_axis();
                axis = "axis " + data;
                const std::string rows = strategy == dataset_strategy::data_parallel ? data : "-";
                layouts = {layout::parse("[" + rows + ", -]"), layout::parse("[" + rows + "]")};
                layouts.resize(ranks.size());
            }
            const auto& shape = mesh.shape();
            num_shards = std::size_t(layouts[0].split_count(0, shape));
            shard_id = std::size_t(layouts[0].block_index(0, shape, mesh.coords()));
            for (const auto& l : layouts)
                for (std::size_t d = 0; d < l.rank(); ++d)
                    if (d == 0 ? l.dims[0] != layouts[0].dims[0] : !l.dims[d].empty())
                        plain = false;
            const auto b = options.batch_size;
            if (b == 0)
                throw error("xshard: loader: the batch size is 0");
            if (b % num_shards != 0 && !options.uneven_batches)
                throw error("xshard: loader: the global batch size " + std::to_string(b) +
                            " is not a multiple of the " + std::to_string(num_shards) +
                            " shards of " + axis + " on mesh(" + mesh.shape().to_string() +
                            "); choose another batch size or set uneven_batches");
            if (samples == 0)
                throw error("xshard: loader: the dataset is empty");
            if (options.drop_remainder && samples < b)
                throw error("xshard: loader: the dataset has " + std::to_string(samples) +
                            " samples, fewer than one batch of " + std::to_string(b) +
                            " (drop_remainder leaves no step)");
            steps = options.drop_remainder ? samples / b : (samples + b - 1) / b;
        }

        /// Throws unless `options.layouts` holds one layout of the right rank per tensor of
        /// a batch, each fitting the mesh, without pending sums.
        void check_layouts() const {
            const auto& l = options.layouts;
            if (l.size() != ranks.size())
                throw error("xshard: loader: " + std::to_string(l.size()) +
                            " layouts for a batch of " + std::to_string(ranks.size()) +
                            (ranks.size() == 1 ? " tensor" : " tensors (x, y)"));
            for (std::size_t i = 0; i < l.size(); ++i) {
                if (l[i].rank() != ranks[i])
                    throw error("xshard: loader: layout " + l[i].to_string() + " for tensor " +
                                std::to_string(i) + " of the batch, which has rank " +
                                std::to_string(ranks[i]));
                try {
                    l[i].validate(mesh.shape());
                } catch (const std::invalid_argument& e) {
                    throw error(std::string("xshard: loader: ") + e.what());
                }
                if (!l[i].partial.empty())
                    throw error("xshard: loader: layout " + l[i].to_string() +
                                " has pending sums; a batch is read, not summed");
            }
        }

        /// The data axis (see loader_options::data_axis); checked against the mesh.
        std::string data_axis() const {
            std::string axis = options.data_axis;
            if (axis.empty()) {
                const auto& shape = mesh.shape();
                if (mesh.dataset() != dataset_strategy::unset)
                    axis = std::string(shape.names[mesh.data_axis()].view());
                else
                    axis = std::string(shape.names[shape.find("dp").value_or(0)].view());
            }
            if (!mesh.shape().find(axis))
                throw error("xshard: loader: the mesh(" + mesh.shape().to_string() +
                            ") has no data axis '" + axis + "'");
            return axis;
        }

        /// Rows of the global batch of `step`.
        std::size_t rows(std::size_t step) const {
            const auto b = options.batch_size;
            return std::min(b, samples - step * b);
        }

        /// This rank's part of the global batch of `step` in `ordered` (the epoch's order):
        /// every num_shards-th sample from position shard_id.
        template <class O>
        auto local_part(O ordered, std::size_t step) const {
            const auto first = step * options.batch_size;
            return std::move(ordered) |
                   ranges::views::slice(std::ptrdiff_t(first), std::ptrdiff_t(first + rows(step))) |
                   ranges::views::drop(std::ptrdiff_t(shard_id)) |
                   ranges::views::stride(std::ptrdiff_t(num_shards));
        }

        /// The batch of `step` from the epoch's samples `ordered`, each tensor in its layout.
        template <class O>
        auto batch(const O& ordered, std::size_t step) const {
            auto mine = collate(local_part(ordered, step), width); // the shard's rows
            if (plain)
                return wrap(std::move(mine), rows(step));
            const std::array<std::size_t, 2> shape{rows(step), width};
            auto block = [&](std::size_t i) {
                return block_of(layouts[i], mesh.shape(), shape, mesh.coords());
            };
            // Rows beyond this rank's shard where a tensor's first dimension is split
            // otherwise, then the blocks of the other dimensions.
            auto tensor = [&](std::size_t i, auto&& pick) {
                const auto b = block(i);
                auto full = layouts[i].dims[0] == layouts[0].dims[0]
                                ? pick(mine)
                                : pick(collate(global_rows(ordered, step, b.offset[0], b.extent[0]),
                                               width));
                using F = std::remove_cvref_t<decltype(full)>;
                if constexpr (F::rank == 2)
                    if (b.extent[1] != width)
                        return F(xt::view(full, xt::all(),
                                          xt::range(b.offset[1], b.offset[1] + b.extent[1])));
                return F(std::move(full));
            };
            if constexpr (requires { mine.y; }) {
                using T = typename decltype(mine.x)::value_type;
                auto x = tensor(0, [](auto&& m) { return std::move(m.x); });
                auto y = tensor(1, [](auto&& m) { return std::move(m.y); });
                return wrap(example_batch<T>{std::move(x), std::move(y)}, shape[0]);
            } else {
                return wrap(tensor(0, [](auto&& m) { return std::move(m); }), shape[0]);
            }
        }

        /// The samples at rows [first, first + count) of the global batch of `step`: row r
        /// is row r - block_offset of shard block_holding(r), which reads position shard +
        /// num_shards * (that row) of the batch (local_part).
        template <class O>
        auto global_rows(const O& ordered, std::size_t step, std::size_t first,
                         std::size_t count) const {
            const auto n = rows(step), S = num_shards;
            const auto start = step * options.batch_size;
            return ranges::views::iota(first, first + count) |
                   ranges::views::transform([&ordered, n, S, start](std::size_t r) {
                       const auto k = block_holding(n, S, r);
                       return ordered[std::ptrdiff_t(start + k + S * (r - block_offset(n, S, k)))];
                   });
        }

        template <class T>
        distributed_examples<T, Mesh> wrap(example_batch<T> local, std::size_t rows) const {
            return {from_local(mesh, std::array{rows, width}, std::move(local.x), layouts[0]),
                    from_local(mesh, std::array{rows}, std::move(local.y), layouts[1])};
        }
        template <class T>
        dtensor<T, Mesh, dynamic_layout(2)> wrap(xt::xtensor<T, 2> local, std::size_t rows) const {
            return from_local(mesh, std::array{rows, width}, std::move(local), layouts[0]);
        }
    };

    template <class R>
    static std::shared_ptr<state> make_state(const Mesh& mesh, R&& data,
                                             const loader_options& options) {
        std::shared_ptr<state> s;
        if constexpr (ranges::view_<std::remove_cvref_t<R>> || std::is_lvalue_reference_v<R>) {
            s = std::make_shared<state>(mesh, ranges::views::all(std::as_const(data)), options);
        } else {
            auto owned = std::make_shared<const std::remove_cvref_t<R>>(std::move(data));
            s = std::make_shared<state>(mesh, ranges::views::all(*owned), options);
            s->owner = std::move(owned);
        }
        s->check();
        return s;
    }

    std::shared_ptr<const std::vector<index_type>> order(std::uint64_t epoch) const {
        const auto& o = state_->options;
        return std::make_shared<const std::vector<index_type>>(
            o.shuffle ? permutation(state_->samples, o.seed, epoch)
                      : detail::identity_order(state_->samples));
    }

    std::shared_ptr<state> state_;
};

template <mesh_type Mesh, class R>
loader(const Mesh&, R&&, const loader_options&) -> loader<Mesh, detail::stored_view_t<R>>;

} // namespace xshard::data

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/data/loader.ipp>
#endif
