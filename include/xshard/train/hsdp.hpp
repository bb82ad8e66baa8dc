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
///     ...                                  // zero_grad as before
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

#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/sharded_layout.hpp>
#include <xshard/core/volume.hpp>
#include <xshard/param/traversal.hpp>
#include <xshard/param/weight.hpp>
#include <xshard/redistribute/batch.hpp>
#include <xshard/redistribute/plan.hpp>
#include <xshard/train/gradients.hpp>

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <span>
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
    level3 = 3, ///< also the weights between uses (ZeRO-3, FSDP)
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
    /// (hybrid sharding: split over shard_size ranks, replicated over the rest). When it is
    /// the size of a set of the weight's replicated axes, the split is over those (the
    /// minor-most such set). Otherwise it is over part of one axis (with whole minor axes
    /// when needed): groups of shard_size / (whole axes) consecutive ranks of that axis (dp = 4
    /// with shard_size 2: ranks {0, 1} and {2, 3}), or, when that cannot make the size
    /// either (36 ranks and more: (4, 9) with 6), over parts of several axes, each group
    /// holding the whole sharded state, replicated across the groups. That state lives on the
    /// mesh of this rank's group (the same mesh type, the axes cut to the group's extent),
    /// where it is an ordinary layout; its reduce-scatter runs within the group, followed by
    /// an all-reduce of the block across the groups. Such a state saves into a checkpoint of
    /// either form (each tensor with its group's mesh and ranks, as the group of rank 0 holds
    /// it), and into a pipeline's checkpoint (pipeline/checkpoint.hpp: the group of its stage
    /// mesh's rank 0 writes it), that loads into any level, mesh, pipeline or world size.
    int shard_size = -1;
    /// Weights of fewer than this many KB (global shape x element size / 1024) stay unsharded.
    std::int64_t threshold = 64;
    xshard::optimizer_level optimizer_level = xshard::optimizer_level::level1;
    /// (xshard) Whether hsdp::backward also starts the all-reduce buckets (level1's sharded
    /// weights, unsharded weights) nonblocking as layers finish. Off by default: on one node
    /// MPI's nonblocking all-reduce measured slower than xshard's blocking pairwise one
    /// (bench_training), which then runs in synchronize_gradients.
    bool overlap_allreduce = false;
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
    return std::nullopt;
}

/// The ranks a weight's update is split over (see hsdp_axes): `axes`, a set of mesh axes,
/// of which those in `parts` only in part: axis a of part (a, inner) is cut into copies of
/// `inner` consecutive ranks (coordinates [o inner, (o + 1) inner) for copy o), and a copy
/// of the state is one such block of every part's axis (with the whole other axes), each
/// copy holding the whole sharded state, replicated across the copies (hybrid sharding over
/// part of the group). The state then lives on the mesh of one copy: the mesh with each
/// part's axis of size `inner`.
struct hsdp_group {
    axis_set axes;
    std::vector<std::pair<int, int>> parts; ///< (axis, inner), by axis
    bool empty() const noexcept { return axes.empty(); }
};

/// Where the rank at `coords` of `mesh` sits when the axes of `parts` are cut into copies
/// (hsdp_group): the copy (its index `outer`, counting the parts' blocks row-major in axis
/// order), the copy's mesh shape, and the rank's coordinates in it.
struct hsdp_copy {
    int outer = 0;
    mesh_shape shape;
    mesh_coords coords;
};

inline hsdp_copy hsdp_copy_of(const mesh_shape& mesh, mesh_coords coords,
                              const std::vector<std::pair<int, int>>& parts) {
    hsdp_copy c{0, mesh, coords};
    for (const auto& [axis, inner] : parts) {
        const auto a = std::size_t(axis);
        c.outer = c.outer * (mesh.sizes[a] / inner) + coords[a] / inner;
        c.shape.sizes[a] = inner;
        c.coords[a] = coords[a] % inner;
    }
    return c;
}

/// The mesh axes (a subset of `replicated`, sizes > 1) a weight's update is split over under
/// `shard_size`: all of them for -1, else the set whose sizes multiply to shard_size (the
/// minor-most such set); when no set of whole axes has that size, a set of whole axes and
/// the `inner` consecutive ranks of one more axis (the minor-most such choice: dp = 4 with
/// shard_size 2 splits dp into copies of 2); when neither exists, parts of several axes,
/// taken minor axes first (each the greatest common divisor of what remains and the axis:
/// (4, 9) with shard_size 6 takes 3 of 9 and 2 of 4; this needs 36 ranks or more). Empty:
/// the weight stays unsharded. Throws xshard::error when shard_size does not divide the
/// group.
inline hsdp_group hsdp_axes(axis_set replicated, const mesh_shape& mesh, int shard_size,
                            const std::string& name) {
    axis_set group;
    for (std::size_t i = 0; i < mesh.ndim(); ++i)
        if (replicated.contains(i) && mesh.sizes[i] > 1)
            group = group.with(i);
    const int size = mesh.group_size(group);
    if (shard_size == -1 || size == 1)
        return {group, {}};
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
    if (best)
        return {*best, {}};
    // Part of one axis a (minor-most first) with a set of whole other axes.
    for (std::size_t a = mesh.ndim(); a-- > 0;) {
        if (!group.contains(a))
            continue;
        const axis_set rest{group.bits & ~axis_set::of(a).bits};
        std::optional<axis_set> whole;
        int inner = 0;
        for (std::uint32_t bits = rest.bits;; bits = (bits - 1) & rest.bits) {
            const axis_set s{bits};
            const int w = mesh.group_size(s);
            if (shard_size % w == 0) {
                const int k = shard_size / w;
                if (k > 1 && k < mesh.sizes[a] && mesh.sizes[a] % k == 0 &&
                    (!whole || s.bits > whole->bits)) {
                    whole = s;
                    inner = k;
                }
            }
            if (bits == 0)
                break;
        }
        if (whole)
            return {whole->with(a), {{int(a), inner}}};
    }
    // Parts of several axes, minor axes first: shard_size divides the group's size, so every
    // prime factor it takes is left in some axis.
    hsdp_group g;
    int left = shard_size;
    for (std::size_t a = mesh.ndim(); a-- > 0 && left > 1;) {
        if (!group.contains(a))
            continue;
        const int k = std::gcd(left, mesh.sizes[a]);
        if (k == 1)
            continue;
        g.axes = g.axes.with(a);
        if (k < mesh.sizes[a])
            g.parts.insert(g.parts.begin(), {int(a), k});
        left /= k;
    }
    if (left != 1) // unreachable: shard_size divides the group
        throw error("xshard: hsdp: shard_size " + std::to_string(shard_size) + " for weight '" +
                    name + "' does not factor over the mesh " + mesh.to_string());
    return g;
}

} // namespace detail

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

/// Seconds a sharding spent in each phase of its steps, summed since construction or
/// `reset_timings()`: what bounds a step (bench_training prints them).
struct hsdp_timings {
    double compute = 0;      ///< the layers' forward and backward run by hsdp::forward/backward
    double gather_wait = 0;  ///< all-gathers: packing, starting and waiting for them (exposed)
    double reduce_wait = 0;  ///< gradient reductions: packing, starting, waiting (exposed)
    double local_copies = 0; ///< master blocks and gradients sliced into the shards (local)
    double update = 0;       ///< the optimizer's update of the shards
    int steps = 0;           ///< calls of `step`
};

/// Whether a model's layers can be run one at a time (nn::sequential): `layer_count` layers,
/// `get<I>()` the I-th, whose weights are named "I.<...>". hsdp::forward and hsdp::backward
/// then gather (level3) and reduce each layer's weights around that layer alone; other
/// models are one unit.
template <class M>
concept layered_model = requires(M& m) {
    { M::layer_count } -> std::convertible_to<std::size_t>;
    m.template get<0>();
};

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
            comm_ = comm;
            const auto& f = gradients.fusion;
            gathers_ = make_fused(f.allgather.bytes(), true);
            scatters_ = make_fused(level() >= 2 ? f.reducescatter.bytes() : 0, false);
            for (auto& u : units_) {
                u.gathers = plan_unit(u.members, true);
                if (level() >= 2)
                    u.scatters = plan_unit(u.members, false);
            }
        }
        if (!allreduced.empty()) {
            values_ = std::make_unique<detail::selected_weights<M>>(
                detail::selected_weights<M>{model_, allreduced, false});
            grads_ = std::make_unique<detail::selected_weights<M>>(
                detail::selected_weights<M>{model_, std::move(allreduced), true});
            // Planned once: it reads the gradients' addresses afresh at every run.
            sync_.emplace(*values_, *grads_, gradients_);
        }
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
            finish_all();
            if (level() == 3)
                materialize();
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
        begin_forward();
        if constexpr (layered_model<M>) {
            forward_layer<0>(x);
            return x;
        } else {
            for (std::size_t u = 0; u < units_.size(); ++u)
                start_gather(u);
            for (std::size_t u = 0; u < units_.size(); ++u)
                ensure_gathered(u);
            const auto t = clock::now();
            auto y = model_->forward(std::move(x));
            timings_.compute += seconds_since(t);
            for (std::size_t u = 0; u < units_.size(); ++u)
                release_values(u);
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
            for (std::size_t u = 0; u < units_.size(); ++u)
                start_gather(u);
            for (std::size_t u = 0; u < units_.size(); ++u) {
                ensure_gathered(u);
                allocate_grads(u);
            }
            const auto t = clock::now();
            const auto reduce = [&] {
                timings_.compute += seconds_since(t);
                for (std::size_t u = units_.size(); u-- > 0;) {
                    start_reductions(u);
                    release_values(u);
                }
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
        begin_forward();
        for (std::size_t u = 0; u < units_.size(); ++u)
            start_gather(u);
        for (std::size_t u = 0; u < units_.size(); ++u) {
            ensure_gathered(u);
            allocate_grads(u);
        }
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
        for (std::size_t u = units_.size(); u-- > 0;) {
            start_reductions(u);
            release_values(u);
        }
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
        auto t = clock::now();
        if (sync_) {
            if (driven_ && options_.overlap_allreduce)
                sync_->wait();
            else
                sync_->synchronize();
        }
        for (std::size_t u = 0; u < units_.size(); ++u)
            finish_reductions(u);
        timings_.reduce_wait += seconds_since(t);
        t = clock::now();
        for (auto& e : entries_)
            if (e.reduced) {
                e.scale();
                if (level() < 3)
                    e.refresh();
            }
        timings_.local_copies += seconds_since(t);
        if (level() == 3) {
            bool missing = false;
            for (auto& e : entries_)
                missing = missing || !e.reduced;
            if (missing)
                throw error("xshard: hsdp: at optimizer_level level3 the backward pass must run "
                            "through hsdp::backward (the weights' gradients are sharded as "
                            "each layer finishes)");
        }
        for (const auto& f : scatters_) {
            bool done = false;
            for (std::size_t i : f.members)
                done = done || entries_[i].reduced;
            if (done) {
                // Reduced by backward; a member that was not (another unit) runs alone.
                t = clock::now();
                for (std::size_t i : f.members)
                    if (!entries_[i].reduced)
                        entries_[i].to_shard();
                timings_.reduce_wait += seconds_since(t);
                continue;
            }
            // A fused bucket whose gradients all hold their terms travels in one exchange;
            // otherwise (or a bucket of one) each weight's own plan runs.
            bool fuse = bool(f.run);
            for (std::size_t i : f.members)
                fuse = fuse && entries_[i].terms();
            t = clock::now();
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
            timings_.reduce_wait += seconds_since(t);
        }
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
            materialize();
            return;
        }
        const auto t = clock::now();
        for (const auto& f : gathers_) {
            if (f.run)
                f.run();
            else
                for (std::size_t i : f.members)
                    entries_[i].gather();
        }
        timings_.gather_wait += seconds_since(t);
    }

    /// `optimizer.step(model, lr)` (which updates the shards) followed, at levels 1 and 2, by
    /// `gather_weights()` (level3 gathers in the next forward pass).
    template <class Optimizer>
    void step(Optimizer& optimizer, double lr) {
        const auto t = clock::now();
        optimizer.step(*model_, lr);
        timings_.update += seconds_since(t);
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
        const auto t = clock::now();
        for (int pass = 0; pass < (level() == 3 ? 2 : 1); ++pass)
            for (std::size_t u = 0; u < units_.size(); ++u) {
                if (level() == 3) {
                    ensure_gathered(u);
                    release_values(u);
                } else {
                    for (auto& f : units_[u].gathers)
                        f.run();
                }
            }
        for (std::size_t u = 0; u < units_.size(); ++u) {
            if (level() == 3)
                allocate_grads(u);
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
        return seconds_since(t);
    }

private:
    using clock = std::chrono::steady_clock;
    static double seconds_since(clock::time_point t) {
        return std::chrono::duration<double>(clock::now() - t).count();
    }

    int level() const noexcept { return int(options_.optimizer_level); }

    /// One sharded weight's collectives, type-erased.
    struct entry {
        std::function<void()> to_shard; ///< the gradient and the master block into the shard
        std::function<void()> gather;   ///< the master block back into the value
        std::function<void()> refresh;  ///< the master block from the value (local)
        std::function<void()> scale;    ///< the mean: the sharded gradient / copies
        std::function<bool()> terms;    ///< whether the gradient holds its terms
        /// Level3: the value's storage given (uninitialised) or taken; the gradient's given
        /// (zero terms), taken, or given back at destruction.
        std::function<void()> allocate_value, release_value, allocate_grad, release_grad,
            restore_grad;
        /// Adds the weight to a batch plan of its element type: the all-gather (true) or the
        /// reduce-scatter of its terms (false).
        std::function<void(void*, bool)> add_to;
        /// The gradient / sharded gradient, or the sharded master / value (gather), as
        /// source and destination of the batch.
        std::function<const void*(bool)> source;
        std::function<void*(bool)> destination;
        std::type_index type = typeid(void);
        std::size_t bytes = 0;
        bool reduced = false; ///< the shard's gradient holds this step's reduction
        /// Where the shard lives: 0 the weight's mesh, s > 0 the copy mesh refinements_[s-1]
        /// (a split over part of an axis), whose `across_reduce` sums the reduce-scattered
        /// gradient block over the copies.
        int space = 0;
        std::function<void()> across_reduce;
    };

    /// A cut of mesh axes into copies (hsdp_group's `parts`): the mesh of this rank's copy
    /// (the weights' mesh type, each part's axis of its `inner` size; type-erased) and the
    /// communicator of the ranks at this rank's place in every copy.
    struct refinement {
        std::vector<std::pair<int, int>> parts;
        std::shared_ptr<void> mesh;
        const communicator* comm = nullptr; ///< the copy mesh's, for the batch plans
        mesh_shape shape;
        communicator across;
    };

    /// The index (>= 1) of the refinement of `mesh` cutting it into copies by `parts`, made
    /// on first use (collective over the mesh: two splits and the copy mesh's construction;
    /// every rank asks for the same ones in the same order).
    template <class Mesh>
    int refine(const Mesh& mesh, const std::vector<std::pair<int, int>>& parts) {
        for (std::size_t i = 0; i < refinements_.size(); ++i)
            if (refinements_[i].parts == parts)
                return int(i) + 1;
        const auto copy =
            detail::hsdp_copy_of(mesh.shape(), mesh.shape().coords(mesh.rank()), parts);
        const int sub_rank = copy.shape.rank_of(copy.coords);
        const communicator part = mesh.comm().split(copy.outer, sub_rank);
        std::array<int, Mesh::ndim> sizes{};
        for (std::size_t i = 0; i < Mesh::ndim; ++i)
            sizes[i] = copy.shape.sizes[i];
        auto m = std::make_shared<Mesh>(part, sizes);
        refinement r;
        r.parts = parts;
        r.comm = &m->comm();
        r.shape = m->shape();
        r.mesh = std::move(m);
        r.across = mesh.comm().split(sub_rank, copy.outer);
        refinements_.push_back(std::move(r));
        return int(refinements_.size());
    }

    const communicator& space_comm(int space) const {
        return space == 0 ? *comm_ : *refinements_[std::size_t(space) - 1].comm;
    }
    const mesh_shape& space_shape(int space) const {
        return space == 0 ? mesh_shape_ : refinements_[std::size_t(space) - 1].shape;
    }

    /// A fused bucket: sharded weights of one element type whose all-gathers (or
    /// reduce-scatters) travel in one exchange; `start` and `finish` its two halves.
    struct fused {
        std::vector<std::size_t> members;
        std::function<void()> run, start, finish;
        std::function<bool()> test;
    };

    /// The weights of one layer (those whose names share the first component): gathered,
    /// freed and reduced together by forward and backward.
    struct unit {
        std::string prefix;
        std::vector<std::size_t> members;     ///< sharded weights (entries)
        std::vector<std::string> allreduced;  ///< weights of the all-reduce buckets
        std::vector<fused> gathers, scatters; ///< one per element type
        bool present = false; ///< level3: the values have storage (gathered or on the way)
        bool gathering = false;
        bool scattering = false;
        bool user = false; ///< level3: materialised by gather_weights
    };

    static std::string prefix_of(const std::string& name) { return name.substr(0, name.find('.')); }

    std::optional<std::size_t> unit_of(const std::string& prefix) const {
        const auto it = unit_index_.find(prefix);
        if (it == unit_index_.end())
            return std::nullopt;
        return it->second;
    }

    std::size_t unit_for(const std::string& name) {
        const auto p = prefix_of(name);
        if (const auto u = unit_of(p))
            return *u;
        unit_index_[p] = units_.size();
        units_.push_back({});
        units_.back().prefix = p;
        return units_.size() - 1;
    }

    // --- the layer-by-layer passes ---------------------------------------------------------

    template <std::size_t I, class X>
    void forward_layer(X& x) {
        if constexpr (I < M::layer_count) {
            const auto u = unit_of(std::to_string(I));
            if (u) {
                ensure_gathered(*u);
                if (*u + 1 < units_.size())
                    start_gather(*u + 1); // prefetch while this layer computes
            }
            const auto t = clock::now();
            x = model_->template get<I>().forward(x);
            timings_.compute += seconds_since(t);
            if (u && *u + 1 < units_.size())
                release_values(*u); // the last layer's stay: the backward pass starts there
            forward_layer<I + 1>(x);
        }
    }

    template <std::size_t I, class G>
    void backward_layer(G& g) {
        if constexpr (I > 0) {
            const auto u = unit_of(std::to_string(I - 1));
            if (u) {
                ensure_gathered(*u);
                if (*u > 0)
                    start_gather(*u - 1);
                allocate_grads(*u);
            }
            const auto t = clock::now();
            g = model_->template get<I - 1>().backward(g);
            timings_.compute += seconds_since(t);
            if (u) {
                start_reductions(*u);
                release_values(*u);
            }
            progress();
            backward_layer<I - 1>(g);
        }
    }

    /// Level3: what the user materialised goes back into the masters (local), and is freed.
    void begin_forward() {
        if (level() != 3)
            return;
        finish_all();
        const auto t = clock::now();
        for (std::size_t u = 0; u < units_.size(); ++u)
            if (units_[u].user) {
                for (std::size_t i : units_[u].members)
                    entries_[i].refresh();
                units_[u].user = false;
                release_values(u);
            }
        timings_.local_copies += seconds_since(t);
    }

    /// Level3: starts unit u's all-gather unless its values are there or on the way.
    void start_gather(std::size_t u) {
        auto& un = units_[u];
        if (level() != 3 || un.present)
            return;
        const auto t = clock::now();
        for (std::size_t i : un.members)
            entries_[i].allocate_value();
        for (auto& f : un.gathers)
            f.start();
        un.present = un.gathering = true;
        timings_.gather_wait += seconds_since(t);
    }

    /// Level3: unit u's values, gathered.
    void ensure_gathered(std::size_t u) {
        if (level() != 3)
            return;
        start_gather(u);
        auto& un = units_[u];
        if (!un.gathering)
            return;
        const auto t = clock::now();
        for (auto& f : un.gathers)
            f.finish();
        un.gathering = false;
        timings_.gather_wait += seconds_since(t);
    }

    void release_values(std::size_t u) {
        auto& un = units_[u];
        if (level() != 3 || !un.present || un.gathering || un.user)
            return;
        for (std::size_t i : un.members)
            entries_[i].release_value();
        un.present = false;
    }

    void allocate_grads(std::size_t u) {
        if (level() != 3)
            return;
        for (std::size_t i : units_[u].members)
            entries_[i].allocate_grad();
    }

    /// Starts unit u's gradient reductions: its reduce-scatters (levels 2 and 3, when every
    /// gradient holds its terms) and its weights' all-reduce buckets.
    void start_reductions(std::size_t u) {
        auto& un = units_[u];
        const auto t = clock::now();
        bool terms = level() >= 2 && !un.members.empty();
        for (std::size_t i : un.members)
            terms = terms && entries_[i].terms();
        if (terms) {
            for (auto& f : un.scatters)
                f.start();
            un.scattering = true;
        }
        if (sync_ && options_.overlap_allreduce)
            for (const auto& name : un.allreduced)
                sync_->ready(name);
        if (level() == 3)
            for (std::size_t i : un.members)
                entries_[i].release_grad(); // packed by start
        timings_.reduce_wait += seconds_since(t);
    }

    void finish_reductions(std::size_t u) {
        auto& un = units_[u];
        if (!un.scattering)
            return;
        for (auto& f : un.scatters)
            f.finish();
        un.scattering = false;
        for (std::size_t i : un.members)
            entries_[i].reduced = true;
    }

    /// Lets MPI move what is in flight (Open MPI progresses inside MPI calls only).
    void progress() {
        for (auto& un : units_) {
            if (un.gathering)
                for (auto& f : un.gathers)
                    (void)f.test();
            if (un.scattering)
                for (auto& f : un.scatters)
                    (void)f.test();
        }
    }

    /// Completes whatever is in flight (gathers kept, reductions dropped).
    void finish_all() {
        for (std::size_t u = 0; u < units_.size(); ++u) {
            auto& un = units_[u];
            if (un.gathering) {
                for (auto& f : un.gathers)
                    f.finish();
                un.gathering = false;
            }
            if (un.scattering) {
                for (auto& f : un.scatters)
                    f.finish();
                un.scattering = false;
            }
        }
    }

    /// Level3: every value gathered, kept until the next forward pass.
    void materialize() {
        const auto t = clock::now();
        for (std::size_t u = 0; u < units_.size(); ++u) {
            ensure_gathered(u);
            units_[u].user = true;
        }
        timings_.gather_wait += seconds_since(t);
    }

    /// Plans, per element type, one exchange for `members`: their all-gather (`gather`) or
    /// the reduce-scatter of their terms.
    std::vector<fused> plan_unit(const std::vector<std::size_t>& members, bool gather) {
        std::map<std::pair<std::type_index, int>, std::vector<std::size_t>> by_type;
        for (std::size_t i : members)
            by_type[{entries_[i].type, entries_[i].space}].push_back(i);
        std::vector<fused> out;
        for (auto& [type, list] : by_type)
            out.push_back(plan_bucket(std::move(list), gather, next_tag_++));
        return out;
    }

    /// One exchange for the sharded weights `members` (of one element type and one space), on
    /// message tag `tag` (exchanges in flight at once use distinct tags); a reduce-scatter on
    /// a copy mesh ends with the sum over the copies.
    fused plan_bucket(std::vector<std::size_t> members, bool gather, int tag) {
        fused f;
        f.members = std::move(members);
        const int space = entries_[f.members.front()].space;
        detail::with_element_type(entries_[f.members.front()].type, [&](auto zero) {
            using T = decltype(zero);
            auto plan = std::make_shared<batch_redistribution_plan<T>>(space_comm(space),
                                                                       space_shape(space));
            for (std::size_t i : f.members)
                entries_[i].add_to(plan.get(), gather);
            f.start = [this, plan, members = f.members, gather, tag] {
                std::vector<const T*> in;
                std::vector<T*> dst;
                for (std::size_t i : members) {
                    in.push_back(static_cast<const T*>(entries_[i].source(gather)));
                    dst.push_back(static_cast<T*>(entries_[i].destination(gather)));
                }
                plan->start(in, dst, tag);
            };
            // Level3 holds memory only while in use: the staging buffers too.
            f.finish = [this, plan, members = f.members, gather, release = level() == 3] {
                plan->finish();
                if (release)
                    plan->release_buffers();
                if (!gather)
                    for (std::size_t i : members)
                        if (entries_[i].across_reduce)
                            entries_[i].across_reduce();
            };
            f.test = [plan] {
                return plan->test();
            };
            f.run = [start = f.start, finish = f.finish] {
                start();
                finish();
            };
        });
        return f;
    }

    /// Groups the sharded weights into buckets of at most `limit` bytes per element type (a
    /// bucket of one weight uses its own planned collective) and plans each bucket's exchange.
    std::vector<fused> make_fused(std::size_t limit, bool gather) {
        using key = std::pair<std::type_index, int>; // element type, space
        std::map<key, std::vector<fused>> by_type;
        std::map<key, std::size_t> filled;
        for (std::size_t i = 0; i < entries_.size(); ++i) {
            const key k{entries_[i].type, entries_[i].space};
            auto& list = by_type[k];
            auto& bytes = filled[k];
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
                    f = plan_bucket(std::move(f.members), gather, 7);
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
        detail::hsdp_group group;
        if (std::uint64_t(bytes) >= std::uint64_t(options_.threshold) * 1024U)
            group = detail::hsdp_axes(v.replicated_axes(ms), ms, options_.shard_size, name);
        const bool shard = !group.empty() && N > 0;
        const bool level2 = level() >= 2;
        auto& un = units_[unit_for(name)];
        if (!shard || !level2) {
            allreduced.insert(name);
            if (ms.group_size(v.replicated_axes(ms)) > 1)
                un.allreduced.push_back(name);
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
        using Mesh = typename D::mesh_type;
        const Mesh* state_mesh = &mesh;
        const communicator* across = nullptr;
        int space = 0;
        if (!group.parts.empty()) {
            space = refine(mesh, group.parts);
            auto& r = refinements_[std::size_t(space) - 1];
            state_mesh = static_cast<const Mesh*>(r.mesh.get());
            across = &r.across;
        }
        const auto& sms = state_mesh->shape();
        const layout s = sharded_layout(v, sms, w.value.shape(), group.axes);
        layouts_[name] = s;
        sharded_.insert(name);
        un.members.push_back(entries_.size());
        const auto extent = block_of(s, sms, w.value.shape(), state_mesh->rank()).extent;
        const auto value_extent = block_of(v, ms, w.value.shape(), mesh.rank()).extent;
        auto make = [&] {
            return G(detail::unchecked, *state_mesh, w.value.shape(),
                     G::local_type::from_shape(extent), s);
        };
        w.shard.emplace(weight_shard<D>{make(), make(), {}});
        w.shard->grad.local().fill(T(0));
        using plan_t = redistribution_plan<T, N>;
        auto slice = std::make_shared<plan_t>(*state_mesh, w.value.shape(), v, s);
        auto back = std::make_shared<plan_t>(*state_mesh, w.value.shape(), s, v);
        slice->execute(w.value.local().data(), w.shard->value.local().data());
        // State the optimizer already has (a loaded checkpoint's) is kept, sliced.
        for (const auto& slot : w.state) {
            w.shard->state.push_back(make());
            slice->execute(slot.local().data(), w.shard->state.back().local().data());
        }
        w.state.clear();
        const layout terms = w.term_layout();
        // The terms as the copy mesh sees them (the same pending sums: no axis there is of
        // one rank that is not one in the mesh); the reduce-scatter on it sums a copy's
        // terms, `across_reduce` then the copies.
        const layout copy_terms = detail::without_unit_sums(dual(v, sms), sms);
        std::shared_ptr<plan_t> scatter;
        if (level2 && !(terms == v))
            scatter = std::make_shared<plan_t>(*state_mesh, w.value.shape(), copy_terms, s);
        const double copies = double(ms.group_size(v.replicated_axes(ms)));
        const bool mean = gradients_.mean;
        W* p = &w;
        entry e;
        e.space = space;
        if (across)
            e.across_reduce = [p, across] {
                auto& l = p->shard->grad.local();
                mpi::allreduce(*across, std::span<T>(l.data(), l.size()), reduction::sum);
            };
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
        e.add_to = [p, v, s, copy_terms](void* plan, bool gather) {
            auto& b = *static_cast<batch_redistribution_plan<T>*>(plan);
            if (gather)
                b.add(p->value.shape(), s, v);
            else
                b.add(p->value.shape(), copy_terms, s);
        };
        e.source = [p](bool gather) -> const void* {
            return gather ? p->shard->value.local().data() : p->grad.local().data();
        };
        e.destination = [p](bool gather) -> void* {
            return gather ? p->value.local().data() : p->shard->grad.local().data();
        };
        e.type = typeid(T);
        e.bytes = bytes;
        e.to_shard = [p, slice, scatter, terms, v, level2, name, scale = e.scale,
                      across_reduce = e.across_reduce] {
            auto& sh = *p->shard;
            const layout g = p->grad.layout();
            if (g == v) {
                slice->execute(p->grad.local().data(), sh.grad.local().data());
            } else if (scatter && g == terms) {
                scatter->execute(p->grad.local().data(), sh.grad.local().data());
                if (across_reduce)
                    across_reduce();
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
        using L = typename D::local_type;
        using GL = typename G::local_type;
        e.allocate_value = [p, value_extent] {
            p->value.local() = L::from_shape(value_extent);
        };
        e.release_value = [p] {
            p->value.local() = L::from_shape(std::array<std::size_t, N>{});
        };
        e.allocate_grad = [p, value_extent, terms] {
            p->grad.local() = GL::from_shape(value_extent);
            p->grad.local().fill(T(0));
            p->relabel(terms);
        };
        e.release_grad = [p, terms] {
            p->grad.local() = GL::from_shape(std::array<std::size_t, N>{});
            p->relabel(terms);
        };
        e.restore_grad = [p, value_extent, terms] {
            if (p->grad.local().size() == 0) {
                p->grad.local() = GL::from_shape(value_extent);
                p->grad.local().fill(T(0));
            }
            p->relabel(terms);
        };
        entries_.push_back(std::move(e));
    }

    M* model_;
    hsdp_options options_;
    gradient_options gradients_;
    layout_dict layouts_;
    std::set<std::string> sharded_;
    std::vector<entry> entries_;
    std::vector<unit> units_;
    std::map<std::string, std::size_t> unit_index_;
    mesh_shape mesh_shape_{};
    const communicator* comm_ = nullptr; ///< the weights' mesh's
    /// Copy meshes of splits over part of an axis (kept in place: entries point in).
    std::deque<refinement> refinements_;
    std::vector<fused> gathers_, scatters_;
    std::unique_ptr<detail::selected_weights<M>> values_, grads_;
    std::optional<gradient_synchronizer> sync_;
    bool driven_ = false; ///< this step's backward ran through `backward`
    int next_tag_ = 1000;
    hsdp_timings timings_;
};

} // namespace xshard
