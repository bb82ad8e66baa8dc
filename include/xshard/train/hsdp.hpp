#pragma once
/// \file
/// Optimizer sharding: MindSpore's `hsdp(shard_size, threshold, optimizer_level)` (ZeRO-1/2).
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
///     ...                                  // zero_grad as before
///
/// Levels (MindSpore's names):
///  * level1: optimizer state and master copy sharded; gradients all-reduced (as without
///    sharding), then this rank's block sliced out (local).
///  * level2: also the gradients: each weight's gradient terms are reduce-scattered straight
///    into the sharded layout; the complete gradient never exists on one rank.
///  * level3 (weights sharded between uses) is not supported yet: asking for it raises.
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

#include <xshard/comm/agree.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/redistribute/batch.hpp>
#include <xshard/redistribute/plan.hpp>
#include <xshard/train/gradients.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

namespace xshard {

/// What optimizer sharding splits (MindSpore's optimizer_level).
enum class optimizer_level {
    level1 = 1, ///< optimizer state and master weights
    level2 = 2, ///< also the gradients (reduce-scatter instead of all-reduce)
    level3 = 3, ///< also the weights between uses (not supported yet)
};

/// "level1", "level2", "level3".
constexpr std::string_view to_string(optimizer_level l) {
    switch (l) {
    case optimizer_level::level1:
        return "level1";
    case optimizer_level::level2:
        return "level2";
    case optimizer_level::level3:
        return "level3";
    }
    return "unknown";
}

/// The level named `name` ("level1", "level2" or "level3"); throws xshard::error otherwise.
inline optimizer_level parse_optimizer_level(std::string_view name) {
    for (auto l : {optimizer_level::level1, optimizer_level::level2, optimizer_level::level3})
        if (name == to_string(l))
            return l;
    throw error("xshard: hsdp: optimizer_level must be one of level1, level2, level3, not '" +
                std::string(name) + "'");
}

/// MindSpore's `hsdp(shard_size, threshold, optimizer_level)`.
struct hsdp_options {
    /// The number of ranks one weight's update is split over: -1 for the weight's whole
    /// data-parallel group (its replicated mesh axes), else a positive divisor of that group
    /// (hybrid sharding: split over shard_size ranks, replicated over the rest). Today it must
    /// be the size of a set of the weight's replicated mesh axes (a mesh (dp_out, dp_in, tp)
    /// gives shard_size = dp_in or dp_out); other divisors raise "not supported yet".
    int shard_size = -1;
    /// Weights of fewer than this many KB (global shape x element size / 1024) stay unsharded.
    std::int64_t threshold = 64;
    xshard::optimizer_level optimizer_level = xshard::optimizer_level::level1;
};

namespace detail {

/// The first of MindSpore's conditions on hsdp options that `o` breaks, if any.
inline std::optional<std::string> hsdp_options_problem(const hsdp_options& o) {
    if (!(o.shard_size == -1 || o.shard_size > 0))
        return "xshard: hsdp: shard_size must be a positive integer or -1, not " +
               std::to_string(o.shard_size);
    if (o.threshold < 0)
        return "xshard: hsdp: threshold must be an integer >= 0 (KB), not " +
               std::to_string(o.threshold);
    const int l = int(o.optimizer_level);
    if (l < 1 || l > 3)
        return "xshard: hsdp: optimizer_level must be one of level1, level2, level3, not " +
               std::to_string(l);
    if (o.optimizer_level == optimizer_level::level3)
        return std::string("xshard: hsdp: optimizer_level level3 (weights sharded between "
                           "uses) is not supported yet: use level1 or level2");
    return std::nullopt;
}

/// The mesh axes (a subset of `replicated`, sizes > 1) a weight's update is split over under
/// `shard_size`: all of them for -1, else the set whose sizes multiply to shard_size (the
/// minor-most such set). Empty: the weight stays unsharded. Throws xshard::error when
/// shard_size does not divide the group or no set of axes has that size.
inline axis_set hsdp_axes(axis_set replicated, const mesh_shape& mesh, int shard_size,
                          const std::string& name) {
    axis_set group;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (replicated.contains(i) && mesh.sizes[i] > 1)
            group = group.with(i);
    const int size = mesh.group_size(group);
    if (shard_size == -1 || size == 1)
        return group;
    if (size % shard_size != 0)
        throw error("xshard: hsdp: shard_size " + std::to_string(shard_size) +
                    " does not divide the data-parallel group of weight '" + name + "' (" +
                    std::to_string(size) + " ranks)");
    if (shard_size == 1)
        return {};
    // Subsets of the group, minor axes first (bit patterns of the axes, largest index first).
    std::optional<axis_set> best;
    for (std::uint32_t bits = group.bits;; bits = (bits - 1) & group.bits) {
        const axis_set s{bits};
        if (mesh.group_size(s) == shard_size && (!best || s.bits > best->bits))
            best = s;
        if (bits == 0)
            break;
    }
    if (!best)
        throw error("xshard: hsdp: shard_size " + std::to_string(shard_size) + " for weight '" +
                    name + "' (data-parallel group of " + std::to_string(size) +
                    " ranks) is not supported yet: it must be the size of a set of the weight's "
                    "replicated mesh axes (mesh " +
                    mesh.to_string() + ")");
    return *best;
}

} // namespace detail

/// The sharded layout of a tensor laid out as `value` with global `shape`: the mesh axes
/// `axes` (which `value` must not use) appended, in mesh order, to the axes of the dimension
/// whose largest block then comes out smallest (the lowest such dimension). `value` itself
/// when `axes` is empty or the tensor has rank 0. No communication.
template <std::size_t N>
layout sharded_layout(const layout& value, const mesh_shape& mesh,
                      const std::array<std::size_t, N>& shape, axis_set axes) {
    if (axes.empty() || N == 0)
        return value;
    const auto g = std::size_t(mesh.group_size(axes));
    std::size_t best_dim = 0, best = 0;
    for (std::size_t d = 0; d < N; ++d) {
        std::size_t v = 1;
        for (std::size_t e = 0; e < N; ++e) {
            const auto k = std::size_t(value.split_count(e, mesh)) * (e == d ? g : 1);
            v *= (shape[e] + k - 1) / k;
        }
        if (d == 0 || v < best) {
            best = v;
            best_dim = d;
        }
    }
    layout out = value;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (axes.contains(i))
            out.dims[best_dim].push_back(mesh.names[i]);
    return out;
}

/// The per-rank bytes of the optimizer's state of `model`'s weights and of the master copies
/// it updates: for a sharded weight its shard's master block and slots, for another its value
/// and slots. No communication.
template <parameter_container M>
std::size_t optimizer_state_bytes(M& model) {
    std::size_t n = 0;
    for_each_weight(model, [&](const std::string&, auto& w) {
        using T = typename std::remove_cvref_t<decltype(w.value)>::value_type;
        auto add = [&](const auto& u) {
            n += u.value.local().size() * sizeof(T);
            for (const auto& s : u.state)
                n += s.local().size() * sizeof(T);
        };
        if (w.shard)
            add(*w.shard);
        else
            add(w);
    });
    return n;
}

namespace detail {

/// The weights of a container whose names are in `names`: their values (`grads` false) or
/// their gradients, as a parameter container (for the all-reduce of the unsharded ones).
template <class C>
struct selected_weights {
    C* container;
    std::set<std::string> names;
    bool grads = false;
    friend void visit_parameters(selected_weights& s, auto&& visit) {
        for_each_weight(*s.container, [&](const std::string& name, auto& w) {
            if (!s.names.contains(name))
                return;
            if (s.grads)
                visit(name, w.grad);
            else
                visit(name, w.value);
        });
    }
};

} // namespace detail

/// The gradients an optimizer reads under sharding: a sharded weight's sharded gradient, an
/// unsharded weight's own, with the weights' names (a parameter container: for global_norm,
/// clip_by_global_norm, local norms; each element is counted once, the sharded layout saying
/// which rank holds it).
template <class C>
struct optimizer_gradients {
    C& container;
    friend void visit_parameters(optimizer_gradients& g, auto&& visit) {
        for_each_weight(g.container, [&](const std::string& name, auto& w) {
            if (w.shard)
                visit(name, w.shard->grad);
            else
                visit(name, w.grad);
        });
    }
};
template <class C>
optimizer_gradients(C&) -> optimizer_gradients<C>;

/// Optimizer sharding of a model (see the file comment): built once (it validates the options,
/// works out each weight's sharded layout, gives the weights their `shard`, plans the
/// collectives and the fusion buckets), then used every step. The model must outlive it and
/// keep its weights where they are. Construction is collective over the weights' mesh (one
/// all-reduce to agree on errors, and the slice of each master block, which is local); invalid
/// options raise xshard::error on every rank.
template <parameter_container M>
class hsdp {
public:
    explicit hsdp(M& model, const hsdp_options& options = {},
                  const gradient_options& gradients = {})
        : model_(&model)
        , options_(options)
        , gradients_(gradients) {
        std::optional<std::string> problem = detail::hsdp_options_problem(options);
        const communicator* comm = nullptr;
        std::set<std::string> allreduced;
        for_each_weight(model, [&](const std::string& name, auto& w) {
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
        try {
            if (comm)
                agree_on_error(*comm, problem);
            else if (problem)
                throw error(*problem);
        } catch (...) {
            drop_shards(); // the model as it was
            throw;
        }
        if (!entries_.empty()) {
            const auto& f = gradients.fusion;
            gathers_ = make_fused(f.allgather.bytes(), true, *comm, mesh_shape_);
            scatters_ = make_fused(
                options.optimizer_level == optimizer_level::level2 ? f.reducescatter.bytes() : 0,
                false, *comm, mesh_shape_);
        }
        if (!allreduced.empty()) {
            values_ = std::make_unique<detail::selected_weights<M>>(
                detail::selected_weights<M>{model_, allreduced, false});
            grads_ = std::make_unique<detail::selected_weights<M>>(
                detail::selected_weights<M>{model_, std::move(allreduced), true});
        }
    }

    // It holds pointers into the model's weights: made in place, never copied or moved.
    hsdp(const hsdp&) = delete;
    hsdp& operator=(const hsdp&) = delete;

    /// Drops the weights' shards: the model is as before sharding (the optimizer's sharded
    /// state is lost; save it first if needed).
    ~hsdp() { drop_shards(); }

    /// The options it was made with.
    const hsdp_options& options() const noexcept { return options_; }

    /// The names of the sharded weights, and their sharded layouts.
    const layout_dict& sharded_layouts() const noexcept { return layouts_; }

    /// Completes the gradients the optimizer reads: all-reduces (in fusion buckets) those of
    /// the unsharded weights and, at level1, of the sharded ones, whose blocks are then sliced
    /// into their shards; at level2 reduce-scatters each sharded weight's gradient terms into
    /// its shard. Also refreshes each master block from the weight's value (local), so a value
    /// loaded or set since the last step is what the update starts from. With
    /// gradient_options::mean the sums become means. Collective over the weights' mesh.
    /// Throws (on every rank alike) for a sharded weight whose gradient is neither its terms
    /// nor complete.
    void synchronize_gradients() {
        // A synchronizer of this step's gradients: a backward pass may give a weight new
        // gradient storage (set_gradient), which a synchronizer kept from before would miss.
        if (grads_)
            gradient_synchronizer(*values_, *grads_, gradients_).synchronize();
        for (const auto& f : scatters_) {
            // A fused bucket whose gradients all hold their terms travels in one exchange;
            // otherwise (or a bucket of one) each weight's own plan runs.
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
        }
    }

    /// All-gathers every sharded weight's updated master block back into its value.
    /// Collective over the weights' mesh: (p-1)/p of each sharded weight's bytes per rank.
    void gather_weights() {
        for (const auto& f : gathers_) {
            if (f.run)
                f.run();
            else
                for (std::size_t i : f.members)
                    entries_[i].gather();
        }
    }

    /// `optimizer.step(model, lr)` (which updates the shards) followed by `gather_weights()`.
    template <class Optimizer>
    void step(Optimizer& optimizer, double lr) {
        optimizer.step(*model_, lr);
        gather_weights();
    }
    template <class Optimizer>
    void step(Optimizer& optimizer) {
        step(optimizer, optimizer.options().lr);
    }

    /// The gradients the optimizer reads (see `optimizer_gradients`): for norms and clipping
    /// after `synchronize_gradients`.
    optimizer_gradients<M> gradients() { return {*model_}; }

private:
    /// One sharded weight's collectives, type-erased.
    struct entry {
        std::function<void()> to_shard; ///< the gradient and the master block into the shard
        std::function<void()> gather;   ///< the master block back into the value
        std::function<void()> refresh;  ///< the master block from the value (local)
        std::function<void()> scale;    ///< the mean: the sharded gradient / copies
        std::function<bool()> terms;    ///< whether the gradient holds its terms
        /// Adds the weight to a batch plan of its element type: the all-gather (true) or the
        /// reduce-scatter of its terms (false).
        std::function<void(void*, bool)> add_to;
        /// The gradient / sharded gradient, or the sharded master / value (gather), as
        /// source and destination of the batch.
        std::function<const void*(bool)> source;
        std::function<void*(bool)> destination;
        std::type_index type = typeid(void);
        std::size_t bytes = 0;
    };

    /// A fused bucket: sharded weights of one element type whose all-gathers (or
    /// reduce-scatters) travel in one exchange.
    struct fused {
        std::vector<std::size_t> members;
        std::function<void()> run;
    };

    /// Groups the sharded weights into buckets of at most `limit` bytes per element type (a
    /// bucket of one weight uses its own planned collective) and plans each bucket's exchange.
    std::vector<fused> make_fused(std::size_t limit, bool gather, const communicator& comm,
                                  const mesh_shape& ms) {
        std::map<std::type_index, std::vector<fused>> by_type;
        std::map<std::type_index, std::size_t> filled;
        for (std::size_t i = 0; i < entries_.size(); ++i) {
            auto& list = by_type[entries_[i].type];
            auto& bytes = filled[entries_[i].type];
            if (list.empty() || limit == 0 || bytes + entries_[i].bytes > limit) {
                list.emplace_back();
                bytes = 0;
            }
            list.back().members.push_back(i);
            bytes += entries_[i].bytes;
        }
        std::vector<fused> out;
        for (auto& [type, list] : by_type)
            for (auto& f : list) {
                if (f.members.size() > 1)
                    detail::with_element_type(type, [&](auto zero) {
                        using T = decltype(zero);
                        auto plan = std::make_shared<batch_redistribution_plan<T>>(comm, ms);
                        for (std::size_t i : f.members)
                            entries_[i].add_to(plan.get(), gather);
                        f.run = [this, plan, members = f.members, gather] {
                            std::vector<const T*> in;
                            std::vector<T*> dst;
                            for (std::size_t i : members) {
                                in.push_back(static_cast<const T*>(entries_[i].source(gather)));
                                dst.push_back(static_cast<T*>(entries_[i].destination(gather)));
                            }
                            plan->execute(in, dst);
                        };
                    });
                out.push_back(std::move(f));
            }
        return out;
    }

    void drop_shards() {
        for_each_weight(*model_, [&](const std::string& name, auto& w) {
            if (sharded_.contains(name))
                w.shard.reset();
        });
    }

    template <class W>
    void add(const std::string& name, W& w, std::set<std::string>& allreduced) {
        using D = typename W::tensor_type;
        using T = typename D::value_type;
        using G = typename W::gradient_type;
        constexpr std::size_t N = D::rank;
        const auto& mesh = w.value.mesh();
        const auto& ms = mesh.shape();
        mesh_shape_ = ms;
        const layout v = w.value.layout();
        const std::size_t bytes = checked_mul(w.value.size(), sizeof(T));
        axis_set axes;
        if (std::uint64_t(bytes) >= std::uint64_t(options_.threshold) * 1024U)
            axes = detail::hsdp_axes(v.replicated_axes(ms), ms, options_.shard_size, name);
        const bool shard = !axes.empty() && N > 0;
        const bool level2 = options_.optimizer_level == optimizer_level::level2;
        if (!shard || !level2)
            allreduced.insert(name);
        if (!shard)
            return;
        if constexpr (sixteen_bit_float<T>)
            if (level2 && gradients_.fp32_communication)
                throw error("xshard: hsdp: fp32_communication with optimizer_level level2 is not "
                            "supported yet (weight '" +
                            name + "' is 16-bit)");
        const layout s = sharded_layout(v, ms, w.value.shape(), axes);
        layouts_[name] = s;
        sharded_.insert(name);
        const auto extent = block_of(s, ms, w.value.shape(), mesh.rank()).extent;
        auto make = [&] {
            return G(detail::unchecked, mesh, w.value.shape(), G::local_type::from_shape(extent),
                     s);
        };
        w.shard.emplace(weight_shard<D>{make(), make(), {}});
        w.shard->grad.local().fill(T(0));
        using plan_t = redistribution_plan<T, N>;
        auto slice = std::make_shared<plan_t>(mesh, w.value.shape(), v, s);
        auto back = std::make_shared<plan_t>(mesh, w.value.shape(), s, v);
        slice->execute(w.value.local().data(), w.shard->value.local().data());
        // State the optimizer already has (a loaded checkpoint's) is kept, sliced.
        for (const auto& slot : w.state) {
            w.shard->state.push_back(make());
            slice->execute(slot.local().data(), w.shard->state.back().local().data());
        }
        w.state.clear();
        const layout terms = w.term_layout();
        std::shared_ptr<plan_t> scatter;
        if (level2 && !(terms == v))
            scatter = std::make_shared<plan_t>(mesh, w.value.shape(), terms, s);
        const double copies = double(ms.group_size(v.replicated_axes(ms)));
        const bool mean = gradients_.mean;
        W* p = &w;
        entry e;
        e.scale = [p, copies, mean] {
            if (mean)
                for (auto& x : p->shard->grad.local())
                    x = T(double(x) / copies);
        };
        e.refresh = [p, slice] {
            slice->execute(p->value.local().data(), p->shard->value.local().data());
        };
        e.terms = [p, terms, level2] {
            return level2 && p->grad.layout() == terms;
        };
        e.add_to = [p, v, s, terms](void* plan, bool gather) {
            auto& b = *static_cast<batch_redistribution_plan<T>*>(plan);
            if (gather)
                b.add(p->value.shape(), s, v);
            else
                b.add(p->value.shape(), terms, s);
        };
        e.source = [p](bool gather) -> const void* {
            return gather ? p->shard->value.local().data() : p->grad.local().data();
        };
        e.destination = [p](bool gather) -> void* {
            return gather ? p->value.local().data() : p->shard->grad.local().data();
        };
        e.type = typeid(T);
        e.bytes = bytes;
        e.to_shard = [p, slice, scatter, terms, v, level2, name, scale = e.scale] {
            auto& sh = *p->shard;
            const layout g = p->grad.layout();
            if (g == v) {
                slice->execute(p->grad.local().data(), sh.grad.local().data());
            } else if (scatter && g == terms) {
                scatter->execute(p->grad.local().data(), sh.grad.local().data());
                scale();
            } else {
                throw error("xshard: hsdp: the gradient of weight '" + name + "' is laid out " +
                            g.to_string() + "; " +
                            (level2 ? "expected its terms " + terms.to_string() + " or "
                                    : std::string("expected ")) +
                            "the complete gradient " + v.to_string());
            }
            slice->execute(p->value.local().data(), sh.value.local().data());
        };
        e.gather = [p, back] {
            back->execute(p->shard->value.local().data(), p->value.local().data());
        };
        entries_.push_back(std::move(e));
    }

    M* model_;
    hsdp_options options_;
    gradient_options gradients_;
    layout_dict layouts_;
    std::set<std::string> sharded_;
    std::vector<entry> entries_;
    mesh_shape mesh_shape_{};
    std::vector<fused> gathers_, scatters_;
    std::unique_ptr<detail::selected_weights<M>> values_, grads_;
};

} // namespace xshard
