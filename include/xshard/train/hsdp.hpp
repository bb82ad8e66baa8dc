#pragma once
/// \file
/// Optimizer sharding: MindSpore's `hsdp(shard_size, threshold, optimizer_level)` (ZeRO-1/2/3,
/// FSDP).
///
/// Data parallelism replicates a weight over its replicated mesh axes (its data-parallel
/// group). Sharding gives each rank of that group 1/dp of the weight's *update*: the optimizer
/// state, the master copy the update writes and (level2) the gradient. The sharded layout is
/// an ordinary xshard layout, the weight's own with the data-parallel axes added to one of its
/// dimensions (after the axes already there; uneven blocks are fine):
///
///     value [-, tp] on mesh (dp, tp)   ->   sharded [dp, tp]
///     value [tp, -]                    ->   sharded [(tp, dp), -]  (or [tp, dp]: the dimension
///                                           whose largest block comes out smallest)
///
/// so every collective is a planned redistribution: [-, tp] -> [dp, tp] is a local slice, its
/// adjoint from the gradient's terms (the dual, partial over dp) a reduce-scatter, and the way
/// back [dp, tp] -> [-, tp] an all-gather. A step under sharding:
///
///     xshard::hsdp sharding(model, {.optimizer_level = xshard::optimizer_level::level2});
///     ...                                  // forward, backward
///     sharding.synchronize_gradients();    // instead of xshard::synchronize_gradients
///     xshard::clip_by_global_norm(sharding.gradients(), 1.0);   // optional
///     sharding.step(optimizer);            // optimizer.step(model) on the shards, all-gather
///     ...                                  // zero_grad as without sharding
///
/// Levels (MindSpore's names):
///  * level1: optimizer state and master copy sharded; gradients all-reduced (as without
///    sharding), then this rank's block sliced out (local).
///  * level2: also the gradients: each weight's gradient terms are reduce-scattered straight
///    into the sharded layout; the complete gradient never exists on one rank.
///  * level3: also the weights themselves. Between uses a sharded weight's value and full
///    gradient hold no storage; `hsdp::forward` all-gathers each layer's weights just before
///    the layer runs (the next layer's all-gather in flight while the current one computes)
///    and frees them after; `hsdp::backward` gathers them again (prefetching the previous
///    layer's), and reduce-scatters each layer's gradient into the shards as soon as the
///    layer's backward is done, freeing the full gradient. Per rank a step holds 1/p of the
///    sharded weights plus the layer in use and the one prefetched.
///
///     xshard::hsdp sharding(model, {.optimizer_level = xshard::optimizer_level::level3});
///     auto y = sharding.forward(x);          // instead of model.forward(x)
///     sharding.backward(loss.backward());    // instead of model.backward(...)
///     sharding.synchronize_gradients();      // waits for the reductions
///     sharding.step(optimizer);              // updates the shards; no gather
///
/// Overlap (every level): run the passes through `hsdp::forward` / `hsdp::backward` and each
/// layer's gradient reduction starts, nonblocking, as soon as its backward is done (the
/// reduce-scatters of levels 2 and 3 as batched exchanges; with `overlap_allreduce` the
/// all-reduce buckets of level1 and of unsharded weights through
/// gradient_synchronizer::ready); `synchronize_gradients`
/// waits for them. A layered_model (nn::sequential) is driven layer by layer, any other
/// model as one unit.
/// Weights smaller than `threshold` KB (global bytes), and weights with no replicated axis of
/// more than one rank, stay unsharded: their gradients are all-reduced in fusion buckets as by
/// `synchronize_gradients`, and the optimizer updates them whole.
///
/// Fusion (MindSpore's comm_fusion `allgather` and `reducescatter`, in `gradient_options::fusion`):
/// the sharded weights of one element type are grouped in order into buckets of at most the
/// threshold (auto: 4 MiB; size: threshold_mib, 0 for one weight per bucket), and a bucket's
/// all-gathers (its level2 reduce-scatters) travel as one exchange (redistribute/batch.hpp); a
/// bucket of one weight runs that weight's planned collective.
///
/// Cost per step and sharded weight of n bytes over a group of p ranks: level1 the all-reduce
/// (2 (p-1)/p n per rank) plus the all-gather ((p-1)/p n); level2 a reduce-scatter and an
/// all-gather ((p-1)/p n each: the all-reduce's volume). The update touches n/p bytes.
///
/// Checkpoints: the optimizer's `state_of(model)` visits the sharded slots (laid out sharded),
/// so an integrated checkpoint saves them whole and loads them into any level, mesh or world
/// size (io/checkpoint.hpp redistributes on load).
///
/// This header is the one to include; it includes the parts, one concept each:
/// hsdp_options.hpp (the options), hsdp_group.hpp (the ranks a weight's update is split
/// over), hsdp_spaces.hpp (the copy meshes the state lives on), hsdp_entry.hpp (one sharded
/// weight: its shard and its collectives), hsdp_exchange.hpp (the fused exchanges),
/// hsdp_units.hpp (the layers, and the gathers and reductions in flight for each),
/// hsdp_timings.hpp (the phases) and hsdp_views.hpp (what the optimizer reads).

#include <xshard/comm/agree.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/float16.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/sharded_layout.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/train/gradients.hpp>
#include <xshard/train/hsdp_entry.hpp>
#include <xshard/train/hsdp_exchange.hpp>
#include <xshard/train/hsdp_group.hpp>
#include <xshard/train/hsdp_options.hpp>
#include <xshard/train/hsdp_spaces.hpp>
#include <xshard/train/hsdp_timings.hpp>
#include <xshard/train/hsdp_units.hpp>
#include <xshard/train/hsdp_views.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace xshard {

/// Optimizer sharding of a model (see the file comment): built once (it validates the options,
/// works out each weight's sharded layout, gives the weights their `shard`, plans the
/// collectives and the fusion buckets), then used every step. The model must outlive it and
/// keep its weights where they are. Construction is collective over the weights' mesh (one
/// all-reduce to agree on errors, and the slice of each master block, which is local); invalid
/// options raise xshard::error on every rank.
///
/// Level3 (and overlap at every level) needs the forward and backward passes to run through
/// `forward(x)` and `backward(dy)`: they gather each layer's weights just before the layer
/// runs (the next layer's gather started, nonblocking, before the current one computes),
/// free them after, and start each layer's gradient reduction (reduce-scatter, or the
/// all-reduce of level1 and unsharded weights) as soon as its backward is done; the update
/// waits for them in `synchronize_gradients`. At level3 the weights' values (and gradients)
/// hold no storage between uses: `gather_weights()` materialises them (to read, save or load
/// them; a value changed then is what the next forward pass starts from).
template <parameter_container M>
class hsdp {
public:
    /// Shards `model`'s weights (see the class comment). Collective over the weights' mesh.
    explicit hsdp(M& model, const hsdp_options& options = {},
                  const gradient_options& gradients = {})
        : model_(&model)
        , options_(options)
        , gradients_(gradients)
        , units_(entries_, timings_, int(options.optimizer_level)) {
        std::set<std::string> allreduced;
        shard_weights(allreduced);
        if (!entries_.empty())
            plan_exchanges();
        if (!allreduced.empty())
            plan_allreduce(std::move(allreduced));
        if (level() == 3)
            for (auto& e : entries_) {
                e.release_value();
                e.release_grad();
            }
    }

    // It holds pointers into the model's weights: made in place, never copied or moved.
    hsdp(const hsdp&) = delete;
    hsdp& operator=(const hsdp&) = delete;

    /// Drops the weights' shards: the model is as before sharding (at level3 its values are
    /// gathered first, a collective every rank reaches at the same point; the optimizer's
    /// sharded state is lost: save it first if needed).
    ~hsdp() {
        try {
            units_.finish_all();
            if (level() == 3)
                units_.materialize();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "xshard: hsdp: gathering the weights at destruction failed: %s\n",
                         e.what());
        }
        if (level() == 3)
            for (auto& e : entries_)
                e.restore_grad();
        drop_shards();
    }

    /// The options it was made with.
    const hsdp_options& options() const noexcept { return options_; }

    /// The names of the sharded weights, and their sharded layouts.
    const layout_dict& sharded_layouts() const noexcept { return layouts_; }

    /// `model.forward(x)` with the weights gathered where level3 needs them (layer by layer
    /// for a layered_model, the next layer's all-gather in flight while a layer computes;
    /// freed after the layer). At levels 1 and 2 it is `model.forward(x)`, timed.
    /// Collective over the weights' mesh.
    template <class X>
    auto forward(X x) {
        units_.begin_forward();
        if constexpr (layered_model<M>) {
            forward_layer<0>(x);
            return x;
        } else {
            units_.gather_all(false);
            const auto t = detail::hsdp_clock::now();
            auto y = model_->forward(std::move(x));
            timings_.compute += detail::seconds_since(t);
            for (std::size_t u = 0; u < units_.size(); ++u)
                units_.release_values(u);
            return y;
        }
    }

    /// `model.backward(dy)`, layer by layer for a layered_model (the whole model otherwise),
    /// starting each layer's gradient reductions, nonblocking, as soon as its backward is
    /// done (reduce-scatters into the shards at levels 2 and 3; with
    /// hsdp_options::overlap_allreduce the all-reduce buckets of level1 and of unsharded
    /// weights too, through gradient_synchronizer::ready) while the layers
    /// before it compute. Level3 gathers each layer's weights again (prefetching the previous
    /// layer's) and frees them and their full gradients after. `synchronize_gradients()`
    /// completes the reductions. One backward pass per step. Collective over the mesh.
    template <class G>
    auto backward(G dy) {
        driven_ = true;
        if constexpr (layered_model<M>) {
            backward_layer<M::layer_count>(dy);
            return dy;
        } else {
            units_.gather_all(true);
            const auto t = detail::hsdp_clock::now();
            const auto reduce = [&] {
                timings_.compute += detail::seconds_since(t);
                units_.start_all_reductions();
            };
            // A model whose input has no gradient (token ids) returns none.
            if constexpr (std::is_void_v<decltype(model_->backward(std::move(dy)))>) {
                model_->backward(std::move(dy));
                reduce();
            } else {
                auto dx = model_->backward(std::move(dy));
                reduce();
                return dx;
            }
        }
    }

    /// Level3, for passes run outside `forward`/`backward` (a pipeline stage's forward and
    /// backward of each micro-batch): all-gathers every sharded weight and gives the
    /// gradients storage (zero terms), once, before the first pass; the values stay until
    /// `end_passes`. No-op at levels 1 and 2. Collective over the weights' mesh.
    void begin_passes() {
        if (level() != 3)
            return;
        units_.begin_forward();
        units_.gather_all(true);
    }

    /// Level3, after the last pass begun by `begin_passes`: starts the reduce-scatter of
    /// each weight's accumulated gradient terms into its shard (and with overlap_allreduce
    /// the all-reduce buckets) and frees the values and full gradients;
    /// `synchronize_gradients()` completes the reductions. No-op at levels 1 and 2.
    /// Collective over the weights' mesh.
    void end_passes() {
        if (level() != 3)
            return;
        driven_ = true;
        units_.start_all_reductions();
    }

    /// Completes the gradients the optimizer reads: waits for the reductions `backward`
    /// started, or (after a backward pass run directly on the model) all-reduces (in fusion
    /// buckets) those of the unsharded weights and, at level1, of the sharded ones, whose
    /// blocks are then sliced into their shards, and at level2 reduce-scatters each sharded
    /// weight's gradient terms into its shard. At levels 1 and 2 it also refreshes each
    /// master block from the weight's value (local), so a value loaded or set since the last
    /// step is what the update starts from. With gradient_options::mean the sums become
    /// means. Collective over the weights' mesh. Throws (on every rank alike) for a sharded
    /// weight whose gradient is neither its terms nor complete, and at level3 when the
    /// backward pass did not run through `backward`.
    void synchronize_gradients() {
        wait_for_reductions();
        const auto t = detail::hsdp_clock::now();
        for (auto& e : entries_)
            if (e.reduced) {
                e.scale();
                if (level() < 3)
                    e.refresh();
            }
        timings_.local_copies += detail::seconds_since(t);
        if (level() == 3) {
            bool missing = false;
            for (auto& e : entries_)
                missing = missing || !e.reduced;
            if (missing)
                throw error("xshard: hsdp: at optimizer_level level3 the backward pass must run "
                            "through hsdp::backward (the weights' gradients are sharded as "
                            "each layer finishes)");
        }
        for (const auto& f : scatters_)
            reduce_into_shards(f);
        for (auto& e : entries_)
            e.reduced = false;
        driven_ = false;
    }

    /// All-gathers every sharded weight's updated master block back into its value (level3:
    /// gives the values their storage first; the next forward pass takes them as they are
    /// then, and frees them). Collective over the weights' mesh: (p-1)/p of each sharded
    /// weight's bytes per rank.
    void gather_weights() {
        if (level() == 3) {
            units_.materialize();
            return;
        }
        const auto t = detail::hsdp_clock::now();
        for (const auto& f : gathers_) {
            if (f.run)
                f.run();
            else
                for (std::size_t i : f.members)
                    entries_[i].gather();
        }
        timings_.gather_wait += detail::seconds_since(t);
    }

    /// `optimizer.step(model, lr)` (which updates the shards) followed, at levels 1 and 2, by
    /// `gather_weights()` (level3 gathers in the next forward pass).
    template <class Optimizer>
    void step(Optimizer& optimizer, double lr) {
        const auto t = detail::hsdp_clock::now();
        optimizer.step(*model_, lr);
        timings_.update += detail::seconds_since(t);
        ++timings_.steps;
        if (level() < 3)
            gather_weights();
    }
    template <class Optimizer>
    void step(Optimizer& optimizer) {
        step(optimizer, optimizer.options().lr);
    }

    /// The gradients the optimizer reads (see `optimizer_gradients`): for norms and clipping
    /// after `synchronize_gradients`.
    optimizer_gradients<M> gradients() { return {*model_}; }

    /// The phase timings since construction or the last reset.
    const hsdp_timings& timings() const noexcept { return timings_; }
    void reset_timings() noexcept { timings_ = {}; }

    /// Runs the communication of one step alone, blocking, and returns its seconds: the
    /// all-gathers (twice at level3: forward and backward), the reduce-scatters and the
    /// all-reduces. For measuring how much of a step's communication overlaps compute;
    /// between steps only (it overwrites the gradients; at level3 the values end freed).
    /// Collective over the weights' mesh.
    double time_communication() {
        const auto t = detail::hsdp_clock::now();
        for (int pass = 0; pass < (level() == 3 ? 2 : 1); ++pass)
            for (std::size_t u = 0; u < units_.size(); ++u) {
                if (level() == 3) {
                    units_.ensure_gathered(u);
                    units_.release_values(u);
                } else {
                    for (auto& f : units_[u].gathers)
                        f.run();
                }
            }
        for (std::size_t u = 0; u < units_.size(); ++u) {
            units_.allocate_grads(u);
            for (auto& f : units_[u].scatters)
                f.run();
            if (level() == 3)
                for (std::size_t i : units_[u].members)
                    entries_[i].release_grad();
        }
        if (sync_)
            sync_->synchronize();
        for (auto& e : entries_)
            e.reduced = false;
        return detail::seconds_since(t);
    }

private:
    int level() const noexcept { return int(options_.optimizer_level); }

    // --- construction ---------------------------------------------------------------------

    /// Gives each weight to shard its shard and entry (`add`), and collects in `allreduced`
    /// the weights whose gradients are all-reduced. Agrees on errors over the weights' mesh
    /// (one all-reduce): on one, the model is left as it was and every rank throws.
    void shard_weights(std::set<std::string>& allreduced) {
        std::optional<std::string> problem = detail::hsdp_options_problem(options_);
        const communicator* comm = nullptr;
        for_each_weight(*model_, [&](const std::string& name, auto& w) {
            const communicator& c = w.value.mesh().comm();
            if (!problem && comm && c.native() != comm->native())
                problem = "xshard: hsdp: weight '" + name +
                          "' lives on another mesh than the weights before it; shard the "
                          "weights of one mesh at a time";
            comm = &c;
            if (problem)
                return;
            try {
                add(name, w, allreduced);
            } catch (const std::exception& e) {
                problem = e.what();
            }
        });
        // Every rank throws the lowest failing rank's message, the same text everywhere.
        try {
            if (comm)
                agree_on_error(*comm, problem);
            else if (problem)
                throw error(*problem);
        } catch (...) {
            drop_shards(); // the model as it was
            throw;
        }
    }

    /// Decides whether weight `name` is sharded (by the threshold and shard_size) and over
    /// which ranks; gives a sharded one its shard and entry, and records in `allreduced` (and
    /// in its unit) a weight whose gradient is all-reduced.
    template <class W>
    void add(const std::string& name, W& w, std::set<std::string>& allreduced) {
        using D = typename W::tensor_type;
        using T = typename D::value_type;
        const auto& mesh = w.value.mesh();
        const auto& ms = mesh.shape();
        spaces_.set_weights_mesh(mesh.comm(), ms);
        const layout value = w.value.layout();
        const std::size_t bytes = checked_mul(w.value.size(), sizeof(T));
        detail::hsdp_group group;
        if (std::uint64_t(bytes) >= std::uint64_t(options_.threshold) * 1024U)
            group = detail::hsdp_axes(value.replicated_axes(ms), ms, options_.shard_size, name);
        const bool shard = !group.empty() && D::rank > 0;
        const bool level2 = level() >= 2;
        auto& unit = units_.of_weight(name);
        if (!shard || !level2) {
            allreduced.insert(name);
            if (ms.group_size(value.replicated_axes(ms)) > 1)
                unit.allreduced.push_back(name);
        }
        if (!shard)
            return;
        if constexpr (sixteen_bit_float<T>)
            if (level2 && gradients_.fp32_communication)
                throw error("xshard: hsdp: fp32_communication with optimizer_level " +
                            std::string(to_string(options_.optimizer_level)) +
                            " is not supported yet (weight '" + name + "' is 16-bit)");
        // Over part of the axes: the state lives on this rank's copy mesh (each part's axis
        // of its `inner` size), where the value's layout names the same block and the split
        // is over whole axes again.
        const int space = group.parts.empty() ? 0 : spaces_.refine(mesh, group.parts);
        const auto& state_mesh = spaces_.mesh(space, mesh);
        const layout sharded =
            sharded_layout(value, state_mesh.shape(), w.value.shape(), group.axes);
        layouts_[name] = sharded;
        sharded_.insert(name);
        unit.members.push_back(entries_.size());
        const detail::hsdp_entry_place<typename D::mesh_type> place{
            &state_mesh, spaces_.across(space), space, level2, gradients_.mean};
        entries_.push_back(detail::make_hsdp_entry(name, w, sharded, place, bytes));
    }

    /// Plans the fusion buckets of the blocking all-gathers and (levels 2 and 3)
    /// reduce-scatters, and each unit's exchanges.
    void plan_exchanges() {
        const auto& f = gradients_.fusion;
        const bool release = level() == 3;
        gathers_ = detail::plan_hsdp_buckets(entries_, spaces_, f.allgather.bytes(), true, release);
        scatters_ = detail::plan_hsdp_buckets(
            entries_, spaces_, level() >= 2 ? f.reducescatter.bytes() : 0, false, release);
        units_.plan(spaces_, next_tag_);
    }

    /// Plans the all-reduce of the gradients of the weights `allreduced` (the unsharded ones
    /// and, at level1, the sharded ones) in fusion buckets.
    void plan_allreduce(std::set<std::string> allreduced) {
        values_ = std::make_unique<detail::selected_weights<M>>(
            detail::selected_weights<M>{model_, allreduced, false});
        grads_ = std::make_unique<detail::selected_weights<M>>(
            detail::selected_weights<M>{model_, std::move(allreduced), true});
        // Planned once: it reads the gradients' addresses afresh at every run.
        sync_.emplace(*values_, *grads_, gradients_);
        if (options_.overlap_allreduce)
            units_.overlap_allreduce(&*sync_);
    }

    void drop_shards() {
        for_each_weight(*model_, [&](const std::string& name, auto& w) {
            if (sharded_.contains(name))
                w.shard.reset();
        });
    }

    // --- the layer-by-layer passes ---------------------------------------------------------

    template <std::size_t I, class X>
    void forward_layer(X& x) {
        if constexpr (I < M::layer_count) {
            const auto u = units_.find(std::to_string(I));
            if (u) {
                units_.ensure_gathered(*u);
                if (*u + 1 < units_.size())
                    units_.start_gather(*u + 1); // prefetch while this layer computes
            }
            const auto t = detail::hsdp_clock::now();
            x = model_->template get<I>().forward(x);
            timings_.compute += detail::seconds_since(t);
            if (u && *u + 1 < units_.size())
                units_.release_values(*u); // the last layer's stay: the backward pass starts there
            forward_layer<I + 1>(x);
        }
    }

    template <std::size_t I, class G>
    void backward_layer(G& g) {
        if constexpr (I > 0) {
            const auto u = units_.find(std::to_string(I - 1));
            if (u) {
                units_.ensure_gathered(*u);
                if (*u > 0)
                    units_.start_gather(*u - 1);
                units_.allocate_grads(*u);
            }
            const auto t = detail::hsdp_clock::now();
            g = model_->template get<I - 1>().backward(g);
            timings_.compute += detail::seconds_since(t);
            if (u) {
                units_.start_reductions(*u);
                units_.release_values(*u);
            }
            units_.progress();
            backward_layer<I - 1>(g);
        }
    }

    // --- the gradients into the shards ----------------------------------------------------

    /// Waits for the all-reduce buckets (or runs them, when `backward` did not start them)
    /// and for every unit's reduce-scatters.
    void wait_for_reductions() {
        const auto t = detail::hsdp_clock::now();
        if (sync_) {
            if (driven_ && options_.overlap_allreduce)
                sync_->wait();
            else
                sync_->synchronize();
        }
        for (std::size_t u = 0; u < units_.size(); ++u)
            units_.finish_reductions(u);
        timings_.reduce_wait += detail::seconds_since(t);
    }

    /// The gradients of fusion bucket `f` into their shards. A bucket `backward` reduced
    /// leaves only its members of other units, each run alone. Otherwise a bucket whose
    /// gradients all hold their terms travels in one exchange, and any other (or a bucket of
    /// one) runs each weight's own plan.
    void reduce_into_shards(const detail::hsdp_exchange& f) {
        bool done = false;
        for (std::size_t i : f.members)
            done = done || entries_[i].reduced;
        const auto t = detail::hsdp_clock::now();
        if (done) {
            for (std::size_t i : f.members)
                if (!entries_[i].reduced)
                    entries_[i].to_shard();
            timings_.reduce_wait += detail::seconds_since(t);
            return;
        }
        bool fuse = bool(f.run);
        for (std::size_t i : f.members)
            fuse = fuse && entries_[i].terms();
        if (fuse) {
            f.run();
            for (std::size_t i : f.members) {
                entries_[i].scale();
                entries_[i].refresh();
            }
        } else {
            for (std::size_t i : f.members)
                entries_[i].to_shard();
        }
        timings_.reduce_wait += detail::seconds_since(t);
    }

    M* model_;
    hsdp_options options_;
    gradient_options gradients_;
    layout_dict layouts_;
    std::set<std::string> sharded_;
    std::vector<detail::hsdp_entry> entries_;
    hsdp_timings timings_;
    /// The meshes the shards live on (kept in place: entries point in).
    detail::hsdp_spaces spaces_;
    detail::hsdp_units units_;
    std::vector<detail::hsdp_exchange> gathers_, scatters_; ///< the fusion buckets
    std::unique_ptr<detail::selected_weights<M>> values_, grads_;
    std::optional<gradient_synchronizer> sync_;
    bool driven_ = false; ///< this step's backward ran through `backward`
    int next_tag_ = 1000; ///< the next message tag of a unit's exchange
};

} // namespace xshard
